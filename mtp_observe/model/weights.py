"""The weights: tensors read from a checkpoint into torch, the head's and the target's, at their serving values.

Contract: `load_head_tensors(info)` reads only the shards that hold the head's tensors (safetensors.safe_open),
dequantising block-FP8 (`dequantize_blockwise`) or wrapping W8A8 linears as served (fp8.py); `load_target(info)`
builds the transformers target from the text config with the checkpoint's weights; `compare_copies` checks a NextN
layer's copies of the embedding and lm_head against the target's. The header-only reading is checkpoint.py.
"""

from __future__ import annotations

from ..errors import CheckpointError
from ..jsonfiles import reason
from .checkpoint import FP8_DTYPE, SCALE_SUFFIX, CheckpointInfo, linear_rules


def dequantize_blockwise(q, scale_inv, block: tuple[int, int]):
    """The serving value of a block-FP8 weight, in fp32: q * scale_inv per block.

    q: [..., R, C] float8_e4m3fn; scale_inv: [..., ceil(R / br), ceil(C / bc)] F32 or BF16 -> [..., R, C] fp32.
    Worked example, block (2, 2), q [3, 3], scale_inv [[s0, s1], [s2, s3]]: rows 0-1 cols 0-1 take s0,
    rows 0-1 col 2 take s1, row 2 cols 0-1 take s2, row 2 col 2 takes s3 (the last blocks are partial).
    """
    br, bc = block
    R, C = q.shape[-2:]
    scale = scale_inv.float().repeat_interleave(br, dim=-2)[..., :R, :].repeat_interleave(bc, dim=-1)[..., :C]
    return q.float() * scale


class _Reader:
    """Reads tensors of one checkpoint by name, opening each shard once; FP8 weights come back dequantised (and
    re-quantised where their serving rule says vLLM does that at load: `rules`, linear_rules)."""

    def __init__(self, info: CheckpointInfo, rules: dict | None = None):
        self.info = info
        self.rules = rules or {}
        self.files: dict[str, object] = {}

    def _file(self, f: str):
        from safetensors import safe_open

        if f not in self.files:
            try:
                self.files[f] = safe_open(str(self.info.path / f), framework="pt", device="cpu")
            except Exception as e:  # safetensors raises its own error type for a damaged file
                raise CheckpointError(f"{self.info.path / f}: cannot open ({reason(e)}); re-download or re-save this shard")
        return self.files[f]

    def raw(self, name: str):
        e = self.info.tensors[name]
        try:
            return self._file(e.file).get_tensor(name)
        except CheckpointError:
            raise
        except Exception as err:
            raise CheckpointError(f"{self.info.path / e.file}: cannot read tensor {name} ({reason(err)}); "
                                  "re-download or re-save this shard")

    def value(self, name: str, dtype=None):
        """The tensor's serving value: dequantised (fp32, then dtype) for block-FP8, else as stored (then dtype)."""
        t = self.raw(name)
        scale = self.info.scale_of(name)
        if self.info.tensors[name].dtype == FP8_DTYPE:
            assert scale is not None and self.info.quantization is not None, name  # read_checkpoint checked it
            t = dequantize_blockwise(t, self.raw(scale), self.info.quantization.block)
            rule = self.rules.get(name)
            if rule is not None and rule.weights == "ue8m0":
                from .fp8 import requantise_ue8m0

                t = requantise_ue8m0(t, self.info.quantization.block)
        return t if dtype is None else t.to(dtype)


def load_tensors(info: CheckpointInfo, names: list[str], device: str = "cpu", dtype=None) -> dict:
    """Read the named tensors from only the shards that hold them (FP8 ones dequantised)."""
    reader = _Reader(info)
    out = {}
    for n in sorted(names, key=lambda n: (info.tensors[n].file, n)):
        t = reader.value(n, dtype)
        out[n] = t.to(device=device)
    return out


def load_head_tensors(info: CheckpointInfo, device: str = "cpu", dtype=None, serving=None) -> dict:
    """The head's tensors keyed without the head's prefix ("mtp." or "model.layers.{L}."), in the form the head
    runs: FP8 weights dequantised, block scales consumed, routed experts as the fused stacks
    `{layer}mlp.experts.gate_up_proj` [E, 2I, H] (gate rows, then up rows) and `{layer}mlp.experts.down_proj`
    [E, H, I] whatever the stored layout. Per-expert tensors are written into the stacks one expert at a time (no
    second copy of the experts). A NextN layer's copies of the embedding and lm_head are not read.
    serving (serving.ServingNumerics): block-FP8 linears as that device serves them (fp8.py: weights re-quantised
    where vLLM does, and weights whose F.linear quantises its input under W8A8)."""
    import torch

    from .fp8 import w8a8

    rules = linear_rules(info, serving)
    reader = _Reader(info, rules)
    prefix, layer = info.head_prefix, info.names.layer
    names = [n for n in info.head_weights if not n.endswith(SCALE_SUFFIX)]
    out = {}
    if info.expert_layout == "per_expert":
        g = info.geometry
        E, inter, H = g.moe.num_experts, g.moe.moe_intermediate_size, g.hidden_size
        p = prefix + layer + "mlp.experts."
        first = info.tensors[p + "0.gate_proj.weight"]
        stack_dtype = dtype or (torch.float32 if first.dtype == FP8_DTYPE else reader.raw(first.name).dtype)
        # Qwen: every MTP layer stores its experts the same way; NextN: the one layer model.layers.{L}.
        head_layers = [f"layers.{i}." for i in range(g.num_layers)] if g.head == "mtp" else [layer]
        for lay in head_layers:
            gate_up = torch.empty(E, 2 * inter, H, dtype=stack_dtype, device=device)
            down = torch.empty(E, H, inter, dtype=stack_dtype, device=device)
            p = prefix + lay + "mlp.experts."
            for e in range(E):
                gate_up[e, :inter] = reader.value(f"{p}{e}.gate_proj.weight", stack_dtype)
                gate_up[e, inter:] = reader.value(f"{p}{e}.up_proj.weight", stack_dtype)
                down[e] = reader.value(f"{p}{e}.down_proj.weight", stack_dtype)
            out[lay + "mlp.experts.gate_up_proj"] = gate_up
            out[lay + "mlp.experts.down_proj"] = down
            names = [n for n in names if not n.startswith(p)]
    for n in sorted(names, key=lambda n: (info.tensors[n].file, n)):
        value = reader.value(n, dtype).to(device=device)
        out[n[len(prefix):]] = w8a8(value, rules[n]) if n in rules else value
    return out


class _DequantisedSlice:
    """A state-dict value transformers' loader materialises with `value[...]` (as it does a safetensors slice):
    the block-FP8 weight dequantised with weight_block_size, read only when the loader asks for it."""

    def __init__(self, info: CheckpointInfo, name: str, dtype, rules: dict | None = None):
        self.info, self.name, self.dtype, self.rules = info, name, dtype, rules

    def __getitem__(self, index):
        assert index is Ellipsis, index
        return _Reader(self.info, self.rules).value(self.name, self.dtype)


def target_module_name(info: CheckpointInfo, name: str) -> str:
    """The transformers causal LM's module of a checkpoint weight: `model.language_model.layers.0.mlp.up_proj.weight`
    (VLM layout) or `model.layers.0.mlp.up_proj.weight` -> `model.layers.0.mlp.up_proj`."""
    assert name.endswith(".weight"), name
    stem = name[: -len(".weight")]
    prefix = info.text_prefix
    return "model." + stem[len(prefix):] if stem.startswith(prefix) else stem


def load_target(info: CheckpointInfo, device: str = "cpu", dtype=None, device_map=None, serving=None):
    """The target as transformers' own causal LM for the family (vision tower and mtp.* are not loaded).

    transformers maps `model.language_model.*` onto the causal LM's `model.*`, and per-expert tensors
    onto its fused experts, itself; every text weight must load (a missing one would silently stay at
    its random init). A block-FP8 checkpoint loads from a state dict whose FP8 weights are dequantised
    here (module doc); its quantization_config is removed from the config so transformers builds plain
    modules rather than its own FP8 layers. serving (serving.ServingNumerics): its block-FP8 linears as that
    device serves them (fp8.py), as load_head_tensors.
    """
    import torch
    import transformers
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    from ..errors import UserError

    dtype = dtype or torch.float32
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        config = AutoConfig.from_pretrained(info.path)
        text_config = config.text_config if info.layout == "vlm" else config
        text_config.tie_word_embeddings = info.tie_word_embeddings
        for holder in (config, text_config):
            if hasattr(holder, "quantization_config"):
                delattr(holder, "quantization_config")
        kwargs = {}
        if info.quantization is not None:
            # The whole text state, by checkpoint name (scales consumed, head and vision left out).
            rules = linear_rules(info, serving)
            kwargs["state_dict"] = {n: _DequantisedSlice(info, n, dtype, rules) for n in info.target_names
                                    if not n.endswith(SCALE_SUFFIX)}
        model_class = getattr(transformers, info.family.causal_lm)
        model, loading = model_class.from_pretrained(
            None if kwargs else info.path, config=text_config, dtype=dtype, device_map=device_map,
            output_loading_info=True, **kwargs,
        )
    except UserError:
        raise
    except Exception as e:  # transformers raises many kinds for a config or weights it cannot use
        raise CheckpointError(f"{info.path / 'config.json'}: transformers cannot build the target from this checkpoint "
                              f"({reason(e)}); restore the checkpoint")
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    missing = [k for k in loading.get("missing_keys", []) if not (info.tie_word_embeddings and k == "lm_head.weight")]
    if missing or loading.get("mismatched_keys"):
        bad = sorted(missing or [m[0] if isinstance(m, tuple) else m for m in loading["mismatched_keys"]])[0]
        raise CheckpointError(f"{info.path}: target weight {bad} is missing or misshapen; the checkpoint is incomplete")
    if device_map is None:
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    rules = linear_rules(info, serving)
    if rules:
        from .fp8 import wrap_linears

        wrap_linears(model, {target_module_name(info, n): rule for n, rule in rules.items() if n in info.target_names})
    return model


def compare_copies(info: CheckpointInfo, rows: int = 4096) -> dict | None:
    """What the NextN layer's copies of the embedding and lm_head hold, compared value by value (in blocks of `rows`
    rows) with the target's own: {"embed_tokens.weight": "equal" | "differs" | "absent", "shared_head.head.weight": ...};
    None for a Qwen head (it ships none). The engines run the target's tensors either way (families.NEXTN_COPIES);
    a copy that differs is what a separately trained head looks like, and the replay does not use it either."""
    import torch

    if not info.names.copies:
        return None
    reader = _Reader(info)
    target = {"embed_tokens.weight": info.embed_name, "shared_head.head.weight": info.lm_head_name}
    out = {}
    for copy in info.names.copies:
        name = info.head_prefix + copy
        if name not in info.tensors:
            out[copy] = "absent"
            continue
        a = reader._file(info.tensors[name].file).get_slice(name)
        b = reader._file(info.tensors[target[copy]].file).get_slice(target[copy])
        equal = True
        for r0 in range(0, info.geometry.vocab_size, rows):
            if not torch.equal(a[r0 : r0 + rows].float(), b[r0 : r0 + rows].float()):
                equal = False
                break
        out[copy] = "equal" if equal else "differs"
    return out
