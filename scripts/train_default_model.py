"""Train the bundled default model: a small Qwen3.5-architecture target and its MTP head, on CPU.

Contract: `python scripts/train_default_model.py` generates the training sessions
(scripts/generate_sessions.py, seed TRAIN_SEED), trains a byte-level BPE tokenizer on their
renderings, trains transformers' `Qwen3_5ForCausalLM` (linear- and full-attention layers,
gated attention, partial rotary 0.25) jointly with an MTP head, saves both in the released
Qwen3.5 layout (VLM wrapper config, `model.language_model.*`, `mtp.*`, tokenizer files and the
package's chat template) into `mtp_observe/default_model/`, then evaluates the saved checkpoint
on the held-out demo sessions in `sessions/` and writes the numbers to `training_log.json`
beside it. `--evaluate-only` runs only the evaluation. Everything is deterministic: seeds,
`torch.use_deterministic_algorithms(True)`, a fixed thread count; nothing is downloaded.

The head is trained as it is served (MTP_HEAD.md) because it *is* the served head: the
training-time head is `mtp_observe.model.mtp.MtpHead` itself, with its Parameters switched to
requires_grad and its embedding / lm_head the target's own Parameters; the losses call its
pieces (`fc_input`, `attention_inputs`, `_attend`, `finish_row`, `logits`).

    depth 1 (the MTP loss):  row r = (h_r, x_{r+1}) at position r, causal over all rows    -> x_{r+2}
    depth 2 (chain step):    (m_r, x_{r+2}) at position r+1, over rows 0..r + itself          -> x_{r+3}
    depth 3 (chain step):    (m2_r, x_{r+3}) at position r+2, over rows 0..r + the depth-2 row + itself -> x_{r+4}

h is the target's post-final-norm hidden state (what its lm_head reads) and the gradients of
every loss flow into the target (joint training, as DeepSeek-V3 and Qwen3-Next train MTP).
Depths 2 and 3 are teacher-forced with the recorded tokens: in serving a chain step only
matters when the previous drafts were accepted, i.e. equal to the recorded tokens, so this is
exactly the conditional the chain is scored on (Qwen3-Next likewise trains its MTP over several
steps to keep training consistent with multi-step drafting). Loss masks: the target's next-token loss on every token;
the head's losses on the rows replay scores (anchors inside assistant completions).

Evaluation (the same rows `mtp-observe replay` scores, ACCEPTANCE.md): per assistant turn i,
prompt_i = template(messages[:i], tools, add_generation_prompt=True), full_i =
template(messages[:i+1], tools); the completion is full_i after prompt_i through <|im_end|>;
turns share a request while the next prompt extends its tokens. Anchors p in [s, e-1];
d_1..d_3 by `MtpHead.chain`; alpha_1 = #(d_1 == x_{p+1}) / #anchors; tau_sim(3) by walking
each span. Negative controls: fc concat reversed, the target's pre-final-norm hidden state,
h_i paired with x_i, and the hidden state delayed by one position (row i gets h_{i-1}; the
other direction, h_{i+1}, would hand the head the target's own prediction of x_{i+2}). Trained
from scratch, this small model's final norm is a near-uniform positive rescale the head reads
through, so the pre-norm control could not bite; the saved checkpoint therefore negates the
final hidden space — an exact reparametrization, every output unchanged (`flip_channel_signs`,
tests/test_default_model.py) — after which the pre-norm state disagrees with what the head
reads, as released checkpoints' massive activations make it disagree there.

Cost: one thread on purpose. On a shared 2-core machine two OpenMP threads spin-wait on each
other and ran ~10x slower; one thread trains the default Config in ~16 min (950 s of training
on a loaded machine, ~1 M tokens) and is bit-for-bit reproducible.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever downloaded
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
import torch.nn.functional as F
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import generate_sessions  # noqa: E402  (scripts/generate_sessions.py)

from mtp_observe.model.families import HeadGeometry, expected_head_shapes  # noqa: E402
from mtp_observe.model.mtp import MtpHead, causal_mask  # noqa: E402
from mtp_observe.model.synthetic import SyntheticSpec, chat_template, save_checkpoint, train_tokenizer  # noqa: E402

DEFAULT_OUT = ROOT / "mtp_observe" / "default_model"
CHECKPOINT_FILES = ("config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                    "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "training_log.json")
SESSIONS_DIR = ROOT / "sessions"
K_EVAL = 3


@dataclass(frozen=True)
class Config:
    # data
    train_sessions: int = 400  # half support, half coding (generate_sessions.TRAIN_SEED)
    tokenizer_sessions: int = 300  # the BPE is trained on these sessions' renderings
    vocab_size: int = 4096
    # model (Qwen3.5 text config)
    hidden_size: int = 192
    intermediate_size: int = 512
    layer_types: tuple = ("linear_attention", "full_attention", "linear_attention", "full_attention")
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64  # rotary_dim = 16 at partial_rotary_factor 0.25
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 32
    linear_value_head_dim: int = 32
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    tie_word_embeddings: bool = False
    # optimisation
    steps: int = 700
    batch_tokens: int = 2048  # requests of similar length per step, up to this many padded tokens (one if longer)
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 30
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    mtp_weights: tuple = (1.0, 0.5, 0.25)  # depth 1, 2, 3 losses of the head
    # determinism
    seed: int = 0
    threads: int = 1  # one thread: deterministic, and immune to OpenMP spin-waiting on a shared CPU
    save_dtype: str = "bfloat16"  # ~7.9 MB on disk; float32 would be ~16 MB
    flipped_channels: int = 192  # final-norm channels whose sign the saved checkpoint flips (see flip_channel_signs)


# =============================================================================================
# Rendering: sessions -> requests (token ids and scored spans), as replay renders them


@dataclass
class Request:
    ids: list[int]
    spans: list[tuple[int, int]] = field(default_factory=list)  # [s, e] inclusive, e the <|im_end|> token
    session: str = ""


def template_messages(messages: list[dict]) -> list[dict]:
    """JSON-string tool-call arguments -> objects: the template renders one <parameter> per key."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = dict(m, tool_calls=[
                dict(c, function=dict(c["function"], arguments=json.loads(c["function"]["arguments"])
                                      if isinstance(c["function"]["arguments"], str) else c["function"]["arguments"]))
                for c in m["tool_calls"]
            ])
        out.append(m)
    return out


def session_requests(tokenizer, session: dict) -> list[Request]:
    """The requests replay builds for one session, each with the spans it scores."""
    messages = template_messages(session["messages"])
    tools = session.get("tools")
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def encode(msgs, gen):
        text = tokenizer.apply_chat_template(msgs, tools=tools, add_generation_prompt=gen, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    requests: list[Request] = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt, full = encode(messages[:i], True), encode(messages[: i + 1], False)
        assert full[: len(prompt)] == prompt, f"{session['id']} turn {i}: the completion does not extend the prompt"
        end = full.index(end_id, len(prompt))
        completion = full[len(prompt) : end + 1]
        current = requests[-1] if requests else None
        if current is not None and prompt[: len(current.ids)] == current.ids:
            current.ids = prompt + completion
        else:
            current = Request(ids=prompt + completion, session=session["id"])
            requests.append(current)
        current.spans.append((len(prompt), len(prompt) + len(completion) - 1))
    return requests


# =============================================================================================
# Tokenizer


def train_bpe(texts: list[str], vocab_size: int):
    """Byte-level BPE with ChatML special tokens; newlines are pre-split one by one, so a prompt that
    ends in "\\n" tokenizes as a prefix of its continuation (no "\\n\\n" token can straddle the cut)."""
    return train_tokenizer(texts, vocab_size, isolate_newlines=True)


def write_tokenizer_files(directory: Path, tok) -> None:
    from mtp_observe.model.synthetic import write_tokenizer

    write_tokenizer(directory, tok, chat_template())


def load_tokenizer(directory: Path):
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    return AutoTokenizer.from_pretrained(str(directory))


def build_tokenizer(sessions: list[dict], vocab_size: int, directory: Path):
    """Train the BPE on the texts of every request of `sessions`, write it, return the transformers tokenizer."""
    from transformers.utils.chat_template_utils import render_jinja_template

    template = chat_template()
    texts = []
    for s in sessions:
        messages = template_messages(s["messages"])
        users = [i for i, m in enumerate(messages) if m["role"] == "user"][1:] + [len(messages)]
        for end in users:  # each request's text: up to the next user message
            rendered, _ = render_jinja_template([messages[:end]], tools=s.get("tools"), chat_template=template)
            texts.append(rendered[0])
    write_tokenizer_files(directory, train_bpe(texts, vocab_size))
    return load_tokenizer(directory)


# =============================================================================================
# Model


def text_config(cfg: Config, tokenizer) -> dict:
    """The text config, written by the same builder as the test checkpoints (synthetic.SyntheticSpec)."""
    interval = 2
    assert list(cfg.layer_types) == ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                     for i in range(len(cfg.layer_types))]
    spec = SyntheticSpec(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=len(cfg.layer_types), full_attention_interval=interval,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        linear_num_key_heads=cfg.linear_num_key_heads, linear_num_value_heads=cfg.linear_num_value_heads,
        linear_key_head_dim=cfg.linear_key_head_dim, linear_value_head_dim=cfg.linear_value_head_dim,
        rope_theta=cfg.rope_theta, partial_rotary_factor=cfg.partial_rotary_factor, initializer_range=0.02,
        dtype=cfg.save_dtype,
        extra={"full_attention_interval": interval, "max_position_embeddings": 32768, "attention_dropout": 0.0,
               "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
               "pad_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>")},
    )
    return spec.text_config()


def head_geometry(tc: dict) -> HeadGeometry:
    return HeadGeometry(
        hidden_size=tc["hidden_size"], num_heads=tc["num_attention_heads"], num_kv_heads=tc["num_key_value_heads"],
        head_dim=tc["head_dim"], intermediate_size=tc["intermediate_size"], vocab_size=tc["vocab_size"],
        rms_norm_eps=tc["rms_norm_eps"], rope_theta=tc["rope_parameters"]["rope_theta"],
        rotary_dim=int(tc["head_dim"] * tc["rope_parameters"]["partial_rotary_factor"]), num_layers=1,
    )


def build_models(cfg: Config, tc: dict) -> tuple[torch.nn.Module, MtpHead]:
    """The target (transformers' own init) and a trainable MtpHead borrowing its embedding and lm_head."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(cfg.seed)
    target_cfg = {k: v for k, v in tc.items() if not k.startswith("mtp_")}
    target = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**target_cfg, tie_word_embeddings=cfg.tie_word_embeddings))
    target.train()
    g = head_geometry(tc)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    tensors = {}
    for name, shape in expected_head_shapes(g).items():
        key = name[len("mtp."):]
        # Zero-centred norms start at 0 (scale 1), matrices like the target's (normal, std initializer_range).
        tensors[key] = torch.zeros(shape) if len(shape) == 1 else torch.randn(shape, generator=gen) * tc["initializer_range"]
    head = MtpHead(g, tensors, embed_tokens=target.model.embed_tokens.weight, lm_head=target.lm_head.weight)
    for p in head.parameters():
        p.requires_grad_(True)  # MtpHead creates its own Parameters frozen (it is an inference module)
    return target, head


def unique_parameters(*modules) -> list[tuple[str, torch.nn.Parameter]]:
    """Named parameters of several modules, each tensor once: the head also registers the target's
    embedding and lm_head (it borrows them), which must not be stepped twice."""
    seen, out = set(), []
    for prefix, module in modules:
        for name, p in module.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append((prefix + name, p))
    return out


# =============================================================================================
# The head's losses, from MtpHead's own pieces


def chain_step(head: MtpHead, rows_key: Tensor, rows_value: Tensor, state: Tensor, tokens: Tensor, r: Tensor,
               step: int, earlier: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One teacher-forced chain step at the rows r (anchors p = r + 1), as `MtpHead.chain` runs it.

    state: [A, H] the previous step's m; tokens: [A] the previous draft (= the recorded token x_{p+step-1});
    rows_key/value: [nkv, n, d] the row pass's cache; earlier: the earlier chain steps' (key, value) at
    these anchors, each [nkv, A, d]. Position p + step - 2 = r + step - 1. Keys: the true rows 0..r,
    then the earlier chain rows of the same anchor, then itself. -> (m: [A, H], this step's (key, value)).
    """
    A = r.shape[0]
    z = head.fc_input(state, tokens)
    query, gate, key, value = head.attention_inputs(z, r + step - 1)
    chain = earlier + [(key, value)]
    n = rows_key.shape[1]
    keys = torch.cat([rows_key] + [k for k, _ in chain], dim=1)
    values = torch.cat([rows_value] + [v for _, v in chain], dim=1)
    mask_prefix = torch.arange(n)[None, :] <= r[:, None]  # true rows 0..r = 0..p-1
    own = torch.eye(A, dtype=torch.bool)  # chain row j belongs to anchor j
    mask = torch.cat([mask_prefix] + [own] * len(chain), dim=1)
    attn = head._attend(query, keys, values, mask)
    return head.finish_row(z, attn, gate), (key, value)


def head_losses(head: MtpHead, hidden: Tensor, ids: Tensor, scored: Tensor, depths: int) -> list[tuple[Tensor, int]]:
    """[(sum of cross-entropies, count)] at depths 1..`depths` for one request.

    hidden: [n, H] the target's post-final-norm states (with grad); ids: [n]; scored: [n] bool, True at
    s+1..e of every completion span [s, e] (the tokens drafts are compared with). Row r serves anchor
    p = r + 1; depth k counts where x_{p+1}..x_{p+k} are all scored (p >= s and p + k <= e, one span).
    """
    n = ids.shape[0]
    positions = torch.arange(n - 1)
    # Depth 1 over every row i = (h_i, x_{i+1}) at position i, causal: the row pass, with grad.
    z = head.fc_input(hidden[: n - 1], ids[1:])
    query, gate, key, value = head.attention_inputs(z, positions)
    attn = head._attend(query, key, value, causal_mask(positions, positions))
    states = head.finish_row(z, attn, gate)  # [n-1, H]  m_r
    scored = torch.cat([scored, torch.zeros(depths + 2, dtype=torch.bool)])
    out = []
    r = torch.nonzero(scored[2 : n + 1]).squeeze(1)  # rows whose depth-1 target x_{r+2} is scored
    m, earlier = states[r], []
    for k in range(1, depths + 1):
        if k > 1:
            keep = scored[r + k + 1]
            r, m = r[keep], m[keep]
            earlier = [(kk[:, keep], vv[:, keep]) for kk, vv in earlier]
            if r.numel() == 0:
                break
            m, kv = chain_step(head, key, value, m, ids[r + k], r, k, earlier)
            earlier.append(kv)
        out.append((F.cross_entropy(head.logits(m), ids[r + k + 1], reduction="sum"), int(r.numel())))
    return out


def scored_mask(request: Request) -> Tensor:
    mask = torch.zeros(len(request.ids), dtype=torch.bool)
    for s, e in request.spans:
        mask[s + 1 : e + 1] = True
    return mask


# =============================================================================================
# Training


def make_batches(requests: list[Request], batch_tokens: int, rng: random.Random) -> list[list[Request]]:
    """Requests of similar length together, B * longest <= batch_tokens; batch order shuffled."""
    order = sorted(requests, key=lambda q: len(q.ids))
    batches, current = [], []
    for q in order:
        if current and (len(current) + 1) * len(q.ids) > batch_tokens:
            batches.append(current)
            current = []
        current.append(q)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def lr_at(step: int, cfg: Config) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def train(cfg: Config, target, head: MtpHead, requests: list[Request], pad_id: int, log=print) -> list[dict]:
    params = unique_parameters(("target.", target), ("mtp.", head))
    decay = [p for _, p in params if p.ndim >= 2]
    no_decay = [p for _, p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)
    rng = random.Random(cfg.seed)
    batches: list[list[Request]] = []
    history, t0, seen_tokens = [], time.time(), 0
    for step in range(cfg.steps):
        if not batches:
            batches = make_batches(requests, cfg.batch_tokens, rng)
        batch = batches.pop()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        # 1. The target over the padded batch (right padding: causal layers never see it).
        L = max(len(q.ids) for q in batch)
        ids = torch.full((len(batch), L), pad_id, dtype=torch.long)
        valid = torch.zeros(len(batch), L, dtype=torch.bool)
        for b, q in enumerate(batch):
            ids[b, : len(q.ids)] = torch.tensor(q.ids)
            valid[b, : len(q.ids)] = True
        hidden = target.model(input_ids=ids).last_hidden_state  # [B, L, H] post-final-norm
        logits = target.lm_head(hidden[:, :-1])
        target_mask = valid[:, 1:]
        loss_target = F.cross_entropy(logits[target_mask], ids[:, 1:][target_mask])
        # 2. The head over each request, on the rows replay scores.
        sums = [torch.zeros(()) for _ in cfg.mtp_weights]
        counts = [0 for _ in cfg.mtp_weights]
        for b, q in enumerate(batch):
            n = len(q.ids)
            for k, (total, count) in enumerate(head_losses(head, hidden[b, :n], ids[b, :n], scored_mask(q), len(cfg.mtp_weights))):
                sums[k] = sums[k] + total
                counts[k] += count
        loss_heads = [s / max(c, 1) for s, c in zip(sums, counts)]
        loss = loss_target + sum(w * l for w, l in zip(cfg.mtp_weights, loss_heads))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in params], cfg.grad_clip)
        opt.step()
        seen_tokens += int(valid.sum())
        if step % 20 == 0 or step == cfg.steps - 1:
            row = {"step": step, "loss_target": round(loss_target.item(), 4),
                   "loss_mtp": [round(l.item(), 4) for l in loss_heads], "lr": round(lr_at(step, cfg), 6),
                   "tokens": seen_tokens, "seconds": round(time.time() - t0, 1)}
            history.append(row)
            log(json.dumps(row))
    return history


# =============================================================================================
# Saving


def flip_channel_signs(text_state: dict, lm_head: Tensor, head_state: dict, channels: Tensor) -> None:
    """Flip the sign of some channels of the final hidden state, exactly preserving every output.

    Negating (1 + w) of the target's final norm at `channels` negates those channels of h; negating
    the same columns of the lm_head keeps the target's logits, negating (1 + w) of the head's
    pre_fc_norm_hidden keeps what the head reads of h (RMS norms are blind to signs), and negating
    (1 + w) of mtp.norm keeps the head's logits through the shared lm_head and what a chain step
    reads of its own m. Nothing measured with the right hidden state changes (tests check it).

    Why: trained from scratch, this small model's final norm is a near-uniform positive rescale
    (1 + w in [1.28, 1.61]) that the head's own norm reads through, so the negative control that
    feeds the pre-final-norm state could not bite, where on released checkpoints it does. With
    signs flipped, the pre-norm state disagrees with what the head was trained on, as it does there.
    The three flipped norm weights are stored in float32, so 1 + w' = -(1 + w) holds exactly.
    """
    def negate_scale(w: Tensor) -> Tensor:
        w = w.float().clone()
        w[channels] = -2.0 - w[channels]  # 1 + w' = -(1 + w)
        return w

    text_state["norm.weight"] = negate_scale(text_state["norm.weight"])
    lm_head[:, channels] = -lm_head[:, channels]
    for key in ("pre_fc_norm_hidden.weight", "norm.weight"):
        head_state[key] = negate_scale(head_state[key])


def save(cfg: Config, tc: dict, target, head: MtpHead, tokenizer_dir: Path, out: Path) -> None:
    dtype = getattr(torch, cfg.save_dtype)
    text_state = {k[len("model."):]: v.detach().to(dtype).contiguous() for k, v in target.state_dict().items()
                  if k.startswith("model.")}
    lm_head = None if cfg.tie_word_embeddings else target.lm_head.weight.detach().to(dtype)
    weights = head.named_weights()  # by checkpoint name without "mtp."
    head_state = {}
    for name in expected_head_shapes(head.geometry):
        key = name[len("mtp."):]
        head_state[key] = weights[key].detach().to(dtype).contiguous()
    if cfg.flipped_channels:
        assert lm_head is not None, "the flip negates lm_head columns, which a tied embedding would share"
        gen = torch.Generator().manual_seed(cfg.seed + 2)
        flip_channel_signs(text_state, lm_head, head_state, torch.randperm(cfg.hidden_size, generator=gen)[: cfg.flipped_channels])
    eos = [tc["eos_token_id"], tc["pad_token_id"]]
    save_checkpoint(out, text_config=tc, text_state=text_state, lm_head=lm_head, head_state=head_state, layout="vlm",
                    tie_word_embeddings=cfg.tie_word_embeddings, shards=1, eos_token_ids=eos)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (out / name).write_bytes((tokenizer_dir / name).read_bytes())


# =============================================================================================
# Evaluation


CONTROLS = ("reversed_concat", "pre_norm_hidden", "pair_h_i_with_x_i", "hidden_delayed_one")


@dataclass
class Counts:
    """Raw counts; rates are derived below (ACCEPTANCE.md)."""

    anchors: int = 0
    accepted: list = field(default_factory=lambda: [0] * K_EVAL)  # [K] #(d_1..d_k all match)
    evaluable: list = field(default_factory=lambda: [0] * K_EVAL)  # [K] #(p + k <= e)
    generated: int = 0  # sum over spans of e - s
    steps: int = 0  # simulated decode steps at K_EVAL
    control_matches: dict = field(default_factory=lambda: {c: 0 for c in CONTROLS})  # depth-1 matches

    def rates(self) -> dict:
        alpha1 = self.accepted[0] / max(self.anchors, 1)
        return {
            "anchors": self.anchors,
            "alpha_1": round(alpha1, 4),
            "A_k": [round(a / max(e, 1), 4) for a, e in zip(self.accepted, self.evaluable)],
            "tau_3": round(1 + sum(a / max(e, 1) for a, e in zip(self.accepted, self.evaluable)), 4),
            "tau_sim_3": round(self.generated / max(self.steps, 1), 4),
            "controls_alpha_1": {c: round(m / max(self.anchors, 1), 4) for c, m in self.control_matches.items()},
        }


def simulate(spans: list[tuple[int, int]], accepted_len: dict[int, int], K: int) -> tuple[int, int]:
    """tau_sim's walk over each span: from anchor p = s, with a = accepted drafts (<= K), emit
    min(a + 1, e - p) tokens and move on. -> (sum of e - s, steps).

    Worked example: span [10, 14], accepted_len {10: 2, 13: 0}: p=10 emits 3 (p=13), p=13 emits
    min(1, 1) = 1 (p=14 = e): 4 tokens in 2 steps, tau_sim = 2.0.
    """
    tokens = steps = 0
    for s, e in spans:
        p = s
        while p < e:
            p += min(min(accepted_len[p], K) + 1, e - p)
            steps += 1
        tokens += e - s
    return tokens, steps


def reversed_concat_head(head: MtpHead) -> MtpHead:
    """The [hidden, embedding] reading of the same weights: fc's two column blocks swapped."""
    from mtp_observe.model.mtp import build_head

    H = head.geometry.hidden_size
    tensors = {name: t.detach() for name, t in head.named_weights().items()}
    tensors["fc.weight"] = torch.cat([tensors["fc.weight"][:, H:], tensors["fc.weight"][:, :H]], dim=1)
    return build_head(head.geometry, tensors, head.embed_tokens, head.lm_head)


@torch.no_grad()
def prefill_with_pre_norm(target, ids: Tensor) -> tuple[Tensor, Tensor]:
    """prefill_hidden's post-final-norm states, and the final norm's input (the pre-norm residual stream)."""
    from mtp_observe.model.target import prefill_hidden

    captured = []
    handle = target.model.norm.register_forward_hook(lambda mod, args, out: captured.append(args[0][0].detach()))
    try:
        hidden = prefill_hidden(target, ids)
    finally:
        handle.remove()
    return hidden, torch.cat(captured, dim=0)


@torch.no_grad()
def score_request(model, request: Request, counts: Counts, controls: bool, reversed_head: MtpHead | None) -> None:
    head = model.head
    ids = torch.tensor(request.ids)
    hidden, pre_norm = prefill_with_pre_norm(model.target, ids)
    rows = head.row_pass(hidden[:-1], ids[1:])
    anchors = torch.tensor([p for s, e in request.spans for p in range(s, e)])
    depths = torch.tensor([min(K_EVAL, e - p) for s, e in request.spans for p in range(s, e)])
    drafts = head.chain(rows, anchors, depths)
    accepted_len = {}
    for a, (p, depth) in enumerate(zip(anchors.tolist(), depths.tolist())):
        run = 0
        for k in range(1, depth + 1):
            counts.evaluable[k - 1] += 1
            if run == k - 1 and int(drafts.tokens[a, k - 1]) == request.ids[p + k]:
                run = k
                counts.accepted[k - 1] += 1
        accepted_len[p] = run
    counts.anchors += len(anchors)
    tokens, steps = simulate(request.spans, accepted_len, K_EVAL)
    counts.generated += tokens
    counts.steps += steps
    if not controls:
        return
    actual = ids[anchors + 1]
    one = torch.ones_like(anchors)
    delayed = torch.cat([hidden[:1], hidden[:-1]])  # row i gets h_{i-1} (row 0 keeps h_0)
    variants = {
        "reversed_concat": (reversed_head, hidden[:-1], ids[1:]),
        "pre_norm_hidden": (head, pre_norm[:-1], ids[1:]),
        "pair_h_i_with_x_i": (head, hidden[:-1], ids[:-1]),
        "hidden_delayed_one": (head, delayed[:-1], ids[1:]),
    }
    for name, (h, hid, nxt) in variants.items():
        d1 = h.chain(h.row_pass(hid, nxt), anchors, one).tokens[:, 0]
        counts.control_matches[name] += int((d1 == actual).sum())


def load_sessions(files: list[Path]) -> list[dict]:
    return [json.loads(line) for f in files for line in Path(f).read_text().splitlines() if line.strip()]


def evaluate(model_dir: Path, session_files: list[Path], controls: bool = True, log=print) -> dict:
    """Score the demo sessions with the saved checkpoint, loaded as replay loads it."""
    from mtp_observe.model.loading import load_model

    t0 = time.time()
    model = load_model(model_dir)
    tokenizer = load_tokenizer(model_dir)
    reversed_head = reversed_concat_head(model.head) if controls else None
    sessions = load_sessions(session_files)
    by_domain: dict[str, Counts] = {}
    n_requests = n_tokens = n_turns = 0
    for session in sessions:
        domain = session.get("meta", {}).get("domain", "all")
        for request in session_requests(tokenizer, session):
            score_request(model, request, by_domain.setdefault(domain, Counts()), controls, reversed_head)
            n_requests += 1
            n_tokens += len(request.ids)
            n_turns += len(request.spans)
    total = Counts()
    for c in by_domain.values():
        total.anchors += c.anchors
        total.generated += c.generated
        total.steps += c.steps
        total.accepted = [a + b for a, b in zip(total.accepted, c.accepted)]
        total.evaluable = [a + b for a, b in zip(total.evaluable, c.evaluable)]
        total.control_matches = {k: v + c.control_matches[k] for k, v in total.control_matches.items()}
    result = {
        "sessions": len(sessions), "assistant_turns": n_turns, "requests": n_requests, "request_tokens": n_tokens,
        **total.rates(), "by_domain": {d: c.rates() for d, c in sorted(by_domain.items())},
        "seconds": round(time.time() - t0, 1),
    }
    return result


# =============================================================================================
# Main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Train (and evaluate) the bundled default model on CPU.")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="checkpoint directory (default: the package's)")
    parser.add_argument("--evaluate-only", action="store_true", help="only evaluate the checkpoint in --out")
    parser.add_argument("--sessions", type=Path, nargs="*", default=None, help="evaluation sessions (default: sessions/*.jsonl)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                        help="override a Config field for an experiment, e.g. --set steps=100")
    parser.add_argument("--no-controls", action="store_true", help="skip the negative controls in the evaluation")
    args = parser.parse_args(argv)
    overrides = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
    unknown = set(overrides) - set(asdict(Config()))
    if unknown:
        parser.error(f"unknown Config field(s): {', '.join(sorted(unknown))}")
    cfg = Config(**{**asdict(Config()), **{k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}})
    session_files = args.sessions or sorted(SESSIONS_DIR.glob("*.jsonl"))

    torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    if not args.evaluate_only:
        log_lines = []

        def log(line):
            print(line, flush=True)
            log_lines.append(line)

        # 1. Data and tokenizer.
        t_start = time.time()
        sessions = generate_sessions.training_sessions(cfg.train_sessions)
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer = build_tokenizer(sessions[: cfg.tokenizer_sessions], cfg.vocab_size, Path(tmp))
            requests = [q for s in sessions for q in session_requests(tokenizer, s)]
            log(f"{len(sessions)} training sessions -> {len(requests)} requests, "
                f"{sum(len(q.ids) for q in requests)} tokens, {sum(e - s for q in requests for s, e in q.spans)} "
                f"scored anchors ({time.time() - t_start:.0f}s)")
            # 2. Models.
            tc = text_config(cfg, tokenizer)
            target, head = build_models(cfg, tc)
            n_params = sum(p.numel() for _, p in unique_parameters(("t.", target), ("m.", head)))
            log(f"parameters: {n_params:,} (target {sum(p.numel() for p in target.parameters()):,})")
            # 3. Train.
            t_train = time.time()
            history = train(cfg, target, head, requests, tc["pad_token_id"], log=log)
            train_seconds = time.time() - t_train
            log(f"training took {train_seconds:.0f}s")
            # 4. Save.
            target.eval()
            for old in CHECKPOINT_FILES:  # a previous checkpoint's files, not anything else there
                for f in args.out.glob(old):
                    f.unlink()
            save(cfg, tc, target, head, Path(tmp), args.out)
    # 5. Evaluate the saved checkpoint as replay loads it.
    result = evaluate(args.out, session_files, controls=not args.no_controls)
    print(json.dumps(result, indent=2))
    log_path = args.out / "training_log.json"
    if not args.evaluate_only:
        record = {"config": asdict(cfg), "train_seconds": round(train_seconds, 1), "threads": cfg.threads,
                  "torch": torch.__version__, "history": history, "evaluation": result}
        log_path.write_text(json.dumps(record, indent=1) + "\n")
    elif log_path.exists():
        record = json.loads(log_path.read_text())
        record["evaluation"] = result
        log_path.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
