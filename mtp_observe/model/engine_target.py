"""The target through a running engine (`replay --target-engine URL`): its hidden states from the engine, the rest here.

Contract: `probe_engine(url)` -> EngineInfo (the engine, its version, the model it serves: run.json's
`target_engine`); `load_engine_model(model_dir, engine, ...)` -> loading.LoadedModel whose `target` holds only the
embedding, the final norm and the lm_head (the target's layers are never loaded: a meta-device module list of none)
and whose prefill (`engine_hidden`, which target.prefill hands to) sends each request's token ids to the engine and
reads back the last layer's hidden state at every position; `self_test_mismatch(hidden, lm_head, engine_top1)` is the
self-test's check, `check_self_test` its one-line error. mtp-observe never imports vLLM: it speaks HTTP to the
OpenAI-compatible server and reads the safetensors file the engine's capture wrote (docs/engine-target.md).

The engine's side is engine_plugin/mtp_observe_vllm_fixes/capture.py, a vLLM worker extension
(`--worker-extension-cls mtp_observe_vllm_fixes.capture.HiddenStateCapture`) called through the server's dev-mode
POST /collective_rpc: `mtp_observe_capture_reset`, then per request one completion (the prompt's token ids,
max_tokens 1, greedy, the prompt's token ids returned) and `mtp_observe_capture_take(NAME)`, which writes
NAME.safetensors ("hidden_states" [n, H]) into the folder the server was given and returns its path, the row count
and whether the rows are after the final norm ("normed"). Rows captured before it get the final norm here.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..errors import UserError

SELF_TEST_REQUESTS = 3  # the first requests of a run are checked against the engine's own prompt_logprobs
TIMEOUT_S = 600


class EngineTargetError(UserError):
    """The target engine cannot be reached, or what it hands back is not the target's hidden states."""


@dataclass(frozen=True)
class EngineInfo:
    url: str  # the server's base URL, as given (no trailing /)
    engine: str  # "vllm"
    version: str  # the engine's own GET /version
    model: str  # the model id the server serves (GET /v1/models)

    def as_dict(self) -> dict:
        return {"url": self.url, "engine": self.engine, "version": self.version, "model": self.model}


def _request(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        detail = e.read()[:300].decode(errors="replace")
        hint = (" (start the server with VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls "
                "mtp_observe_vllm_fixes.capture.HiddenStateCapture: docs/engine-target.md)") if "collective_rpc" in url else ""
        raise EngineTargetError(f"--target-engine: {url} answered {e.code}: {detail}{hint}") from None
    except (urllib.error.URLError, OSError) as e:
        raise EngineTargetError(f"--target-engine: cannot reach {url} ({getattr(e, 'reason', e)}); start the engine "
                                "(docs/engine-target.md) or fix the URL") from None


def probe_engine(url: str) -> EngineInfo:
    """The engine behind url: vLLM's OpenAI-compatible server (GET /version, GET /v1/models)."""
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise EngineTargetError(f"--target-engine {url}: expected an http:// or https:// URL of the engine's server")
    version = _request(base + "/version")
    models = _request(base + "/v1/models")
    served = [m.get("id") for m in (models or {}).get("data", [])]
    if not isinstance(version, dict) or "version" not in version or not served:
        raise EngineTargetError(f"--target-engine {url}: not a vLLM OpenAI-compatible server (GET /version and "
                                "GET /v1/models answered otherwise)")
    return EngineInfo(url=base, engine="vllm", version=str(version["version"]), model=str(served[0]))


class EngineClient:
    """One replay's conversation with the engine: a completion and a capture per request."""

    def __init__(self, info: EngineInfo, hidden_size: int, self_test_requests: int = SELF_TEST_REQUESTS):
        self.info = info
        self.hidden_size = hidden_size
        self.self_tests_left = self_test_requests
        self.self_tested = 0  # requests self-tested since the last self_test_again (the error's "request N")
        self.tokens_sent = 0
        self._rpc("mtp_observe_capture_reset")

    def self_test_again(self) -> None:
        """Self-test the next SELF_TEST_REQUESTS requests too (the run's own, after the estimate's synthetic ones)."""
        self.self_tests_left = SELF_TEST_REQUESTS
        self.self_tested = 0

    def _rpc(self, method: str, *args: str):
        answer = _request(self.info.url + "/collective_rpc", {"method": method, "args": list(args)})
        results = [r for r in (answer or {}).get("results", []) if r is not None]
        return results

    def hidden_states(self, ids: list[int], prompt_logprobs: bool) -> tuple[Tensor, bool, list | None]:
        """ids -> (the last layer's hidden state [n, H] as the engine computed it, whether it is after the final
        norm, the engine's top-1 token at positions 1..n-1 then its greedy next token (prompt_logprobs) or None)."""
        body = {"model": self.info.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
                "return_token_ids": True}
        if prompt_logprobs:
            body["prompt_logprobs"] = 1
        answer = _request(self.info.url + "/v1/completions", body)
        choice = answer["choices"][0]
        sent_back = choice.get("prompt_token_ids")
        if sent_back is not None and list(sent_back) != list(ids):
            first = next((i for i, (a, b) in enumerate(zip(sent_back, ids)) if a != b), min(len(sent_back), len(ids)))
            raise EngineTargetError(f"--target-engine: the engine's prompt differs from the request's at position {first} "
                                    f"({len(sent_back)} tokens back for {len(ids)} sent); the engine must take token ids "
                                    "as they are (no chat template, no added BOS)")
        taken = self._rpc("mtp_observe_capture_take", "r" + uuid.uuid4().hex)
        if len(taken) != 1:
            raise EngineTargetError(f"--target-engine: {len(taken)} workers returned hidden states (expected one: the "
                                    "last pipeline stage's tensor-parallel rank 0)")
        states = _read_states(Path(taken[0]["path"]))
        if states.shape[0] != len(ids) or states.shape[-1] != self.hidden_size:
            raise EngineTargetError(f"--target-engine: the engine captured {states.shape[0]} positions of width "
                                    f"{states.shape[-1]} for a request of {len(ids)} tokens of width {self.hidden_size}; "
                                    "serve one replay at a time with prefix caching off (--no-enable-prefix-caching) "
                                    "and no speculative decoding")
        self.tokens_sent += len(ids)
        top1 = None
        if prompt_logprobs:
            top1 = [_top1(entry) for entry in (choice.get("prompt_logprobs") or [None])[1:]]
            top1.append(int((choice.get("token_ids") or [-1])[0]))
        return states, bool(taken[0].get("normed", True)), top1


def _read_states(path: Path) -> Tensor:
    from safetensors.torch import load_file

    try:
        states = load_file(str(path))["hidden_states"]
    except (OSError, KeyError) as e:
        raise EngineTargetError(f"--target-engine: cannot read the hidden states the engine wrote at {path} ({e}); "
                                "the engine's MTP_OBSERVE_CAPTURE_DIR must be a folder this machine reads too") from None
    path.unlink(missing_ok=True)
    return states


def _top1(entry) -> int:
    """The rank-1 token of one prompt_logprobs entry ({token id: {"logprob", "rank", ...}})."""
    if not entry:
        return -1
    best = min(entry.items(), key=lambda kv: kv[1].get("rank", 1 << 30) if isinstance(kv[1], dict) else 1 << 30)
    return int(best[0])


# ---------------------------------------------------------------------------------------------
# The self-test

TIE_ULPS = 2.0  # bf16 ulps of the largest logit within which two logits count as tied (either argmax is right)


@torch.no_grad()
def self_test_mismatch(hidden: Tensor, lm_head: Tensor, engine_top1: list[int]) -> tuple[int, int, int] | None:
    """hidden [n, H] (post-norm, as the replay uses it), lm_head [V, H], engine_top1 [n]: the engine's top-1 token
    predicted from row i (its prompt_logprobs' top-1 at position i + 1, and its greedy token after the last row) ->
    None, or (row, the local argmax, the engine's top-1) at the first row where they differ by more than a bf16
    near-tie (the engine's token's local logit below the local maximum by more than TIE_ULPS bf16 ulps of it)."""
    logits = torch.nn.functional.linear(hidden.to(lm_head.dtype), lm_head).float()
    local = logits.argmax(-1)
    engine = torch.tensor(engine_top1, dtype=torch.long)
    assert engine.shape[0] == logits.shape[0], (engine.shape, logits.shape)
    valid = (engine >= 0) & (engine < logits.shape[-1])
    top = logits.max(-1).values
    theirs = logits.gather(1, engine.clamp(0, logits.shape[-1] - 1)[:, None])[:, 0]
    ulp = torch.clamp(top.abs(), min=1.0) * 2.0 ** -7  # bf16: 8 significant bits
    wrong = valid & (local != engine) & (top - theirs > TIE_ULPS * ulp)
    if not bool(wrong.any()):
        return None
    row = int(wrong.nonzero()[0, 0])
    return row, int(local[row]), int(engine[row])


def check_self_test(hidden: Tensor, lm_head: Tensor, engine_top1: list[int], request: int) -> None:
    """Raise EngineTargetError (exit 2) when the locally rebuilt logits' argmax is not the engine's own top-1."""
    found = self_test_mismatch(hidden, lm_head, engine_top1)
    if found is None:
        return
    row, ours, theirs = found
    raise EngineTargetError(
        f"--target-engine self-test failed on request {request}: at position {row + 1} the local lm_head on the "
        f"engine's hidden states predicts token {ours}, the engine's own top-1 is token {theirs}; the states are not the "
        "ones its lm_head reads: a capture before the final norm declared after it, an off-by-one layer index, prefix "
        "caching returning partial states (start it with --no-enable-prefix-caching), speculative decoding enabled on "
        "the capture server, or another checkpoint in --model than the engine serves")


# ---------------------------------------------------------------------------------------------
# The local part of the target

def load_local_parts(info, dtype: torch.dtype, device: str = "cpu"):
    """transformers' causal LM for the family built on the meta device with no decoder layers, then only the
    embedding, the final norm and the lm_head read from the checkpoint: what the head and the reductions use."""
    import transformers
    from transformers import AutoConfig

    from .weights import load_tensors

    config = AutoConfig.from_pretrained(info.path)
    text_config = config.text_config if info.layout == "vlm" else config
    text_config.tie_word_embeddings = info.tie_word_embeddings
    model_class = getattr(transformers, info.family.causal_lm)
    with torch.device("meta"):
        model = model_class._from_config(text_config, dtype=dtype)
    model.model.layers = torch.nn.ModuleList()  # the target's layers are the engine's, never loaded here
    norm_name = info.text_prefix + "norm.weight"
    names = sorted({info.embed_name, info.lm_head_name, norm_name})
    tensors = load_tensors(info, names, device=device, dtype=dtype)
    model.model.embed_tokens.to_empty(device=device)
    model.model.embed_tokens.weight.data.copy_(tensors[info.embed_name])
    model.model.norm.to_empty(device=device)
    model.model.norm.weight.data.copy_(tensors[norm_name])
    if info.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    else:
        model.lm_head.to_empty(device=device)
        model.lm_head.weight.data.copy_(tensors[info.lm_head_name])
    for name, p in model.named_parameters():
        assert p.device.type != "meta", f"{name} left on the meta device"
    model.eval()
    model.requires_grad_(False)
    return model


def load_engine_model(model_dir, engine: EngineInfo, dtype: torch.dtype, device: str = "cpu", head_engine: str = "vllm",
                      self_test_requests: int = SELF_TEST_REQUESTS):
    """loading.LoadedModel on `device` with the engine as its target's layers (module doc)."""
    from .checkpoint import read_checkpoint, reading_for
    from .loading import LoadedModel
    from .mtp import build_head
    from .weights import load_head_tensors

    info = read_checkpoint(model_dir)
    target = load_local_parts(info, dtype, device)
    target.engine = EngineClient(engine, info.geometry.hidden_size, self_test_requests)
    head = build_head(info.geometry, load_head_tensors(info, device=device, dtype=dtype),
                      embed_tokens=target.model.embed_tokens.weight, lm_head=target.lm_head.weight,
                      reading=reading_for(info, head_engine))
    return LoadedModel(info=info, target=target, head=head, device=device, dtype=dtype)


@torch.no_grad()
def engine_hidden(model, input_ids: Tensor, on_chunk=None) -> Tensor:
    """target.prefill's hidden states through the engine: the whole request is sent (the engine keeps no prefix for
    us), the post-norm hidden state [n, H] at every position comes back (the final norm applied here to rows captured
    before it); the first requests are self-tested."""
    client: EngineClient = model.engine
    ids = [int(t) for t in input_ids.tolist()]
    testing = client.self_tests_left > 0
    states, normed, top1 = client.hidden_states(ids, prompt_logprobs=testing)
    hidden = states.to(device=model.lm_head.weight.device, dtype=model.lm_head.weight.dtype)
    if not normed:
        hidden = model.model.norm(hidden)
    if testing:
        client.self_tests_left -= 1
        client.self_tested += 1
        check_self_test(hidden, model.lm_head.weight, top1, client.self_tested)
    if on_chunk is not None:
        on_chunk(len(ids))
    return hidden
