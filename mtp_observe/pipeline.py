"""The pipeline: the one place that ties the stages together.

Contract: `load_model` turns a checkpoint directory into the target (transformers) and the
head (ours, borrowing the target's embedding and lm_head), on one device and dtype. `replay`
writes a run directory (tables.py) from session files.

Which samplers a replay scores (one p_accept_<profile> column and one set of fit sums each):
`default_profiles` (the Qwen3.5 card's four, greedy, the checkpoint's generation_config when it
has one), replaced or extended by `--sampling`, plus `recorded`: each session's own meta.sampling
(`session_sampler`; a key absent or null takes the server default, generation_config, else vLLM's),
and for a session without one the fallback (`recorded_fallback`: the `--recorded-with` sampler,
else generation_config, else vLLM's defaults). Profiles with equal parameters are computed once.

Drafters (`--drafters`, drafters/roster.py): the head always drafts when mtp or a hybrid is asked for; every
other drafter drafts at the same anchors from the same tokens, and the target scores all their drafts in one
reduction per request (`drafter_columns`). With model-free drafters only (ngram, suffix) no weights are read:
the model directory need hold only the tokenizer (and generation_config.json for the end-of-turn ids), the rows
have no target columns, and the run runs on the CPU (`model_free_request`). Suffix decoding's global tree is fed
every session of the input in input order on every rank (`_replay_sessions`), so rows do not depend on the
number of ranks or on resuming.

Past one process (docs/scale.md): `--shard I/N` replays the sessions shards.py assigns to shard I (by id, or by
tokens) and reads the others' recorded outputs into the global tree in input order, as a torchrun rank does;
`--ray` hands the sessions to replicas on a Ray cluster (cluster.py). Both write an ordinary run directory whose
requests carry each session's input index (`session_index`), the canonical order the report reads.
What-ifs (`--head-precision`, `--draft-p-min`; docs/whatifs.md): a copy of the head per precision
(precisions.head_at, built once) runs its own row pass and chain at the same anchors of every request; its rows
join the served head's in the one target reduction and are written after them with `head_precision` set
(whatif_heads.py). The thresholds need only every head draft's confidence
(`draft_confidence`); the report walks them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint import CheckpointInfo, load_head_tensors, load_target, read_checkpoint, reading_for
from .errors import CheckpointError, OptionError
from .manifest import COUNT_KEYS, MAX_KEYS, finish_manifest, identity, start_manifest
from .mtp import MtpHead, build_head
from .ranks import Ranks, portable, ranks_from_env
from .target import RECORDED
from .whatif_heads import HeadWhatIfs, head_whatifs, reduce_with, with_whatif_rows

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def default_model_dir() -> Path:
    """The small trained Qwen3.5-architecture checkpoint shipped inside the package."""
    path = Path(__file__).parent / "default_model"
    if not (path / "config.json").exists():
        raise OptionError(f"no --model given and the bundled default model is missing at {path}; pass --model DIR")
    return path


def resolve_device(device: str) -> str:
    """auto -> cuda when available, else cpu; cuda[:i] must exist."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise OptionError(f"--device {device}: no CUDA device is visible; use --device cpu (or auto)")
        index = device.partition(":")[2]
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise OptionError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return device
    raise OptionError(f"--device {device}: expected auto, cpu, cuda or cuda:N")


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """auto -> bfloat16 on CUDA, float32 on CPU (PRODUCT.md's performance rules)."""
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in DTYPES:
        raise OptionError(f"--dtype {dtype}: expected auto, float32 or bfloat16")
    return DTYPES[dtype]


@dataclass(frozen=True)
class LoadedModel:
    info: CheckpointInfo
    target: object  # transformers Qwen3_5ForCausalLM, eval mode
    head: MtpHead
    device: str
    dtype: torch.dtype
    serving: object = None  # serving.ServingNumerics the model was loaded for (None: weight-only, PyTorch top-k)

    @property
    def top_k_ties(self) -> str:
        return self.serving.top_k_ties if self.serving is not None else "all"


def load_model(model_dir: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32,
               device_map: str | None = None, head_engine: str = "vllm", serving=None) -> LoadedModel:
    """device_map ("auto", accelerate) spreads a target too large for one device over all visible ones;
    the head then sits with the lm_head on the last device. head_engine: whose reading of the head to run where
    the engines differ (families.head_reading; NextN heads only): "vllm" (0.33) or "sglang" (0.5.23). serving
    (serving.ServingNumerics): a block-FP8 checkpoint's linears as that device serves them (W8A8, re-quantised
    weights: fp8.py); None: weight-only."""
    info = read_checkpoint(model_dir)
    reading = reading_for(info, head_engine)
    if device_map is not None:
        try:
            import accelerate  # noqa: F401
        except ImportError:
            raise OptionError("--device-map needs accelerate: pip install 'mtp-observe[scale]' (or pip install accelerate)")
    target = load_target(info, device=device, dtype=dtype, device_map=device_map, serving=serving)
    head = build_head(
        info.geometry, load_head_tensors(info, device=str(target.lm_head.weight.device), dtype=dtype, serving=serving),
        embed_tokens=target.model.embed_tokens.weight, lm_head=target.lm_head.weight, reading=reading,
    )
    return LoadedModel(info=info, target=target, head=head, device=device, dtype=dtype, serving=serving)


# ---------------------------------------------------------------------------------------------
# Replay: sessions -> requests -> target + head -> rows -> run directory


@dataclass(frozen=True)
class ReplayOptions:
    k: int = 4
    chunk_size: int = 2048
    device: str = "auto"
    dtype: str = "auto"
    profiles: tuple = ()  # SamplingProfile; empty means the built-in ones and the checkpoint's generation_config
    recorded_with: str | None = None  # the profile the traffic was recorded with, as declared (--recorded-with)
    on_error: str = "fail"
    max_sessions: int | None = None
    resume: bool = False
    overwrite: bool = False
    device_map: str | None = None  # "auto": spread the target over every visible GPU (accelerate)
    head_engine: str = "vllm"  # --head-reading: whose reading of the head to replay (families.head_reading)
    template: object = None  # rendering.TemplateOverrides: --chat-template / --template-kwargs (None: the checkpoint's)
    drafters: tuple = ("mtp",)  # --drafters, drafters.roster names in the order given
    ngram: object = None  # drafters.ngram.NgramConfig (--ngram MIN,MAX); None: vLLM's defaults
    suffix: object = None  # drafters.suffix.SuffixConfig (--suffix-*); None: vLLM's defaults
    serve_device: str = "h100"  # --serve-device: the GPU whose vLLM numerics the run describes (serving.py)
    fp8_activations: str | None = None  # --fp8-activations dynamic|none; None: what vLLM runs on the serve device
    part_sessions: int = 256  # sessions per part file at most (parts.py; 1: a part per session, as before grouping)
    shard: object = None  # shards.Shard (--shard I/N, --shard-by): replay that shard of the input; None: all of it
    ray: object = None  # cluster.RayOptions (--ray, --replicas, --gpus-per-replica); None: replay in this process
    trees: tuple = ()  # tree.TreeConfig (--tree S,TOPK,T), replayed beside the chain (head_variants.py)
    head_precisions: tuple = ()  # --head-precision: precisions.PRECISIONS names, the head re-run at each (what-ifs)
    draft_p_min: tuple = ()  # --draft-p-min: thresholds in [0, 1] for the confidence-stopped what-if (the report's)


class Observer:
    """Progress callbacks; the CLI draws a progress bar from them. The default does nothing."""

    def estimate(self, estimate) -> None:
        """The work ahead (estimate.Estimate), before the first session; said as the replay's first line. An
        observer that does not override this is not given one: the estimate's calibration (about 2 s on the model)
        is skipped for a caller that would drop it (generation.Observer does the same)."""

    def start(self, sessions: int, tokens: int | None = None) -> None:
        """The sessions this process will handle (and, when known up front — a Ray job renders them first — their
        tokens)."""

    def session_start(self, session_id: str, tokens: int, requests: int, work=None) -> None:
        """A session is about to be replayed: its tokens (all its requests') and requests; work: its
        estimate.ReplayWork (what the progress line's ETA counts), None when no estimate was made."""

    def request(self, index: int) -> None:
        """Request `index` (0-based) of the current session starts."""

    def tokens(self, n: int) -> None:
        """n more tokens of the current session are computed (a prefill chunk)."""

    def reused(self, n: int) -> None:
        """n tokens of the current request are done without being computed: the prefix shared with the request before."""

    def session(self, session_id: str, tokens: int, skipped: bool) -> None:
        """A session ended: replayed, skipped, or (no session_start before it) found finished by --resume."""

    def replayed(self, session_id: str, tokens: int, requests: int) -> None:
        """A session replayed elsewhere (a replica of a Ray job, cluster.py) is done: its tokens count as this job's."""

    def warn(self, message: str) -> None: ...

    def note(self, message: str) -> None: ...


@dataclass(frozen=True)
class RequestResult:
    index: int
    columns: dict  # positions.parquet columns of this request (numpy), see acceptance.request_rows
    fit: dict  # {"tokens": [N], "<stat>_<profile>": [N]} numpy, the recording-sampler sums of its N spans


@dataclass(frozen=True)
class Carry:
    """What one request leaves for the next when they share their first `length` tokens."""

    target: object  # target.TargetPrefix after tokens [0, length)
    rows: object  # mtp.RowPass, rows 0..length-2 (row i needs x_{i+1}, also shared)
    whatif_rows: dict | None = None  # precision -> that head's RowPass over the same rows (HeadWhatIfs)

    @property
    def length(self) -> int:
        return self.target.length


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def replay_request(model: LoadedModel, request, k_max: int, profiles, chunk_size: int,
                   carry: Carry | None = None, keep_at: int | None = None, drafters=None,
                   keep: int | None = None, recorder=None, on_tokens=None, variants=None,
                   on_reused=None, whatifs: HeadWhatIfs | None = None) -> tuple[dict, dict, Carry | None]:
    """One request through the target and the head: the columns of its rows, the recording-sampler sums
    of its spans (RequestResult.fit), and what the next request reuses.

    1. target: chunked prefill -> post-norm hidden h at every position (after `carry`'s shared prefix)
    2. head: one row pass over every position (its KV covers the prompt; rows of the prefix are
       reused), then the chain at every anchor of every span, depths batched over anchors
    3. target again, lm_head only at the rows' positions p+k-1 and at s-1..e-1 of every span -> argmax,
       log-probs, sampler probs, the fit sums (the penalties read each turn's prompt and output so far)
    4. rows
    Rows depend only on the tokens (causal attention), so reusing a prefix changes nothing measured
    beyond floating-point rounding of where chunk boundaries fall. on_tokens(n), if given, hears each
    prefill chunk's tokens as they are done, on_reused(n) the reused prefix's: the progress line.

    drafters (a drafters.roster.Roster): every drafter of the roster drafts at the same anchors (fed the
    head's drafts for the hybrids; keep: the prefix the next request shares, a hint for suffix decoding)
    and its rows come out with `drafter`/`draft_k` columns (`drafter_columns`); None: the head's rows only.
    variants (head_variants.Variants, with drafters): the trees and the stepwise layer rule, their rows after the
    roster's, reduced by the target in the same call.

    whatifs (HeadWhatIfs): each precision's head runs its own row pass (its KV cache is its own) and chain at the
    same anchors; its rows join the same target reduction (the target's logits once per position) and come out
    after the served head's with `head_precision` set (null on the served rows); with confidence every head row
    carries `draft_confidence` (NaN on other drafters' rows).
    """
    from .acceptance import anchor_plan, request_rows, row_index
    from .target import Turns, prefill, reduce_logits

    ids = torch.tensor(request.input_ids, dtype=torch.long)
    n = ids.shape[0]
    if carry is not None and not (carry.length < n and carry.length >= 2):
        carry = None
    if keep_at is not None and not (keep_at >= 2 and keep_at >= (carry.length if carry else 0)):
        keep_at = None
    segments = torch.full((n,), -1, dtype=torch.int8)
    for sp in request.spans:
        segments[sp.start : sp.end + 1] = torch.frombuffer(bytearray(sp.segments), dtype=torch.int8)
    plan = anchor_plan(request.spans, k_max)
    index = row_index(plan, k_max)
    if recorder is not None:  # routing.RouterRecorder: the MoE routers' picks during this prefill
        recorder.begin_request()
    if on_reused is not None and carry is not None:
        on_reused(carry.length)
    hidden, kept = prefill(model.target, ids, chunk_size, prefix=carry.target if carry else None, keep_at=keep_at,
                           on_chunk=on_tokens)  # 1
    if recorder is not None:
        recorder.end_request(carry.length if carry else 0, [(sp.start, sp.end) for sp in request.spans])
    P = carry.length - 1 if carry else 0  # rows 0..P-1 come from the previous request
    confident = whatifs is not None and whatifs.confidence
    rows = model.head.row_pass(hidden[P:-1], ids[P + 1 :].to(hidden.device), chunk_size=chunk_size,
                               prefix=carry.rows if carry else None)  # 2
    drafts = model.head.chain(rows, plan.anchors, plan.depths, confidence=confident)
    blocks = []
    if variants:
        from .head_variants import variant_blocks

        blocks = variant_blocks(model.head, variants, rows, ids, segments, request.spans, chunk_size)
    other, other_rows = ({}, {}) if whatifs is None else whatifs.draft(  # precision -> Drafts, rows kept
        hidden[P:-1], ids[P + 1 :].to(hidden.device), chunk_size, carry.whatif_rows if carry else None, plan,
        keep_at - 1 if kept is not None else None)
    following = Carry(kept, model.head.rows_prefix(rows, keep_at - 1), other_rows) if kept is not None else None
    del rows
    a, k = index.anchor_index, index.depth
    turns = Turns(ids, torch.tensor([sp.start for sp in request.spans], dtype=torch.long),
                  torch.tensor([sp.end for sp in request.spans], dtype=torch.long))

    def reduce(positions, tokens, actuals, no_min_p=None):
        return reduce_logits(model.target.lm_head.weight, hidden, positions, tokens, actuals, tuple(profiles), turns=turns,
                             top_k_ties=model.top_k_ties, no_min_p=no_min_p)

    # The what-if heads' rows (the Kmax plan's) ride in the same reduction as the served rows, after them.
    extra_tokens = [d.tokens.cpu()[a, k - 1] for d in other.values()]
    served_reduce, whatif_reductions = reduce_with(reduce, index.target_position, ids[index.actual_position], extra_tokens)
    if drafters is not None:
        # the roster takes the head's drafts as [A, Kmax]: a request whose every span is shorter than Kmax + 1 has a
        # chain of fewer columns (chain's K is the deepest anchor's), padded here with no-draft (-1) / NaN
        head_tokens, head_logprobs = drafts.tokens.cpu(), drafts.logprobs.cpu()
        short = k_max - head_tokens.shape[1]
        if short > 0:
            head_tokens = torch.nn.functional.pad(head_tokens, (0, short), value=-1)
            head_logprobs = torch.nn.functional.pad(head_logprobs, (0, short), value=float("nan"))
        groups = drafters.draft(ids.numpy(), request.spans, keep=keep, mtp=head_tokens.numpy())
        columns, reductions = drafter_columns(ids, segments, request.spans, groups, head_logprobs, served_reduce,
                                              extra=blocks, first_code=len(groups))  # 3, 4
    else:
        reductions = served_reduce(index.target_position, drafts.tokens.cpu()[a, k - 1], ids[index.actual_position])  # 3
        columns = request_rows(ids, segments, plan, index, drafts.tokens, drafts.logprobs, reductions, k_max)  # 4
        check_finite(columns)
    if whatifs is not None:
        columns = with_whatif_rows(columns, whatifs, drafts, other, whatif_reductions(), ids, segments, plan, index, k_max,
                                    drafters)
    fit = {"tokens": reductions.fit_tokens.cpu().numpy()}
    for name, sums in reductions.fit.items():
        for stat in ("support", "q", "q2", "var", "ll"):
            fit[f"{stat}_{name}"] = getattr(sums, stat).cpu().numpy()
    return columns, fit, following


def drafter_columns(ids: torch.Tensor, segments: torch.Tensor, spans, groups, head_logprobs: torch.Tensor | None,
                    reduce=None, extra=(), first_code: int = 0) -> tuple[dict, object]:
    """positions.parquet columns of every drafter's rows for one request, and the target's Reductions (None
    without a target).

    groups: [drafters.roster.Drafts] (roster order; `drafter` is the index into it); head_logprobs [A, K]: the
    head's log-probs of its drafts (where a hybrid took the head's draft its draft_logprob is the head's; a
    model-free draft's is NaN); reduce(positions, drafts, actuals, no_min_p) -> target.Reductions (None: no target;
    no_min_p [R] bool marks the rows of drafters vLLM's V1 runner serves: its rejection sampler applies no min-p).
      1. per drafter and draft length K' it drafted for: the anchor plan at K' (depths min(K', e - p)) and rows
      2. the target once over every drafter's rows (its logits are computed once per position, whoever drafted),
         a NO_TOKEN draft gathered at token 0 and masked after: target_logprob NaN, p_accept 0 (nothing
         proposed is nothing accepted) — -1 would silently index the last vocabulary entry
      3. the columns, with `drafter`, `draft_k` and `draft_len` (what vLLM counts as the step's draft tokens)
    extra: head_variants.Block's (trees, the stepwise layer rule): their entries reduced in the same call after the
    drafters' rows, their columns coded first_code, first_code + 1, ... (after the roster's drafters).
    """
    import numpy as np

    from .acceptance import anchor_plan, request_rows, row_index

    parts = []  # (drafter index, K', plan, index, draft tokens [A, K'], draft log-probs [A, K'] or None)
    g_v = {}  # (drafter index, K') -> its variant
    for code, g in enumerate(groups):  # 1
        for v, kk in enumerate(g.draft_ks):
            g_v[(code, kk)] = v
            plan = anchor_plan(spans, kk)
            tokens = torch.from_numpy(np.ascontiguousarray(g.tokens[:, v, :kk]))
            logprobs = None
            if g.from_model is not None:
                assert head_logprobs is not None, "a drafter that takes the head's drafts needs its log-probs"
                take = torch.from_numpy(g.from_model[:, v])[:, None]
                logprobs = torch.where(take, head_logprobs[:, :kk], torch.tensor(float("nan")))
            parts.append((code, kk, plan, row_index(plan, kk), tokens, logprobs))
    reductions = None
    if reduce is not None:  # 2
        drafted = torch.cat([tok[ix.anchor_index, ix.depth - 1] for *_, ix, tok, _ in parts]
                            + [b.tokens for b in extra]).long()
        positions = torch.cat([ix.target_position for *_, ix, _, _ in parts] + [b.positions for b in extra])
        actuals = torch.cat([ids[ix.actual_position] for *_, ix, _, _ in parts] + [b.actuals for b in extra])
        v1 = torch.cat([torch.full((ix.depth.shape[0],), groups[code].runner == "v1") for code, _, _, ix, _, _ in parts]
                       + [torch.zeros(b.positions.shape[0], dtype=torch.bool) for b in extra])  # the head's variants: V2
        none = drafted < 0
        reductions = reduce(positions, drafted.clamp(min=0), actuals, no_min_p=v1 if bool(v1.any()) else None)
        if bool(none.any()):
            reductions.target_logprob[none.to(reductions.target_logprob.device)] = float("nan")
            for values in reductions.p_accept.values():
                values[none.to(values.device)] = 0.0
    out, at = [], 0
    for code, kk, plan, ix, tokens, logprobs in parts:  # 3
        R = ix.depth.shape[0]
        sub = _rows_of(reductions, at, at + R) if reductions is not None else None
        cols = request_rows(ids, segments, plan, ix, tokens, logprobs, sub, kk)
        cols["drafter"] = np.full(R, code, dtype=np.int8)
        cols["draft_k"] = np.full(R, kk, dtype=np.int8)
        # the tokens the anchor's draft holds, past the end of the turn too (a draft is a chain that stops)
        cols["draft_len"] = (tokens >= 0).sum(dim=1).numpy().astype(np.int8)[ix.anchor_index.numpy()]
        from_model = groups[code].from_model
        check_finite(cols, head=from_model[:, g_v[(code, kk)]][ix.anchor_index.numpy()] if from_model is not None
                     else np.zeros(R, dtype=bool))
        out.append(cols)
        at += R
    for code, block in enumerate(extra, start=first_code):
        E = block.positions.shape[0]
        cols = block.finish(_rows_of(reductions, at, at + E) if reductions is not None else None)
        R = len(cols["pos"])
        cols["drafter"] = np.full(R, code, dtype=np.int8)
        cols["draft_k"] = np.full(R, block.draft_k, dtype=np.int8)
        cols["draft_len"] = np.full(R, block.draft_k, dtype=np.int8)  # the head drafts its S (or k) steps every time
        check_finite(cols, head=cols["draft_token"] >= 0)
        out.append(cols)
        at += E
    if any("tree_node" in c for c in out):  # the trees' column: null on every other row
        from .tree_acceptance import NOT_A_TREE

        for c in out:
            c.setdefault("tree_node", np.full(len(c["pos"]), NOT_A_TREE, dtype=np.int8))
    columns = {name: np.concatenate([c[name] for c in out]) for name in out[0]} if out else {}
    return columns, reductions


def _rows_of(reductions, lo: int, hi: int):
    """The Reductions of rows lo..hi-1 (the fit sums stay with the whole request)."""
    from .target import Reductions

    return Reductions(target_token=reductions.target_token[lo:hi], target_logprob=reductions.target_logprob[lo:hi],
                      actual_logprob=reductions.actual_logprob[lo:hi],
                      p_accept={name: values[lo:hi] for name, values in reductions.p_accept.items()})


def model_free_request(request, k_max: int, drafters, keep: int | None = None) -> tuple[dict, dict]:
    """One request's rows from the model-free drafters alone (no weights): the target's columns left out, and
    the fit holds only each span's scored-token count (no sampler sums without the target)."""
    import numpy as np

    ids = torch.tensor(request.input_ids, dtype=torch.long)
    segments = torch.full((ids.shape[0],), -1, dtype=torch.int8)
    for sp in request.spans:
        segments[sp.start : sp.end + 1] = torch.frombuffer(bytearray(sp.segments), dtype=torch.int8)
    groups = drafters.draft(ids.numpy(), request.spans, keep=keep)
    columns, _ = drafter_columns(ids, segments, request.spans, groups, None, None)
    fit = {"tokens": np.array([sp.end - max(sp.start, 1) + 1 for sp in request.spans], dtype=np.int64)}
    return columns, fit


def non_finite_advice(dtype) -> str:
    """What a NaN or inf output means and what to do: in bfloat16 (or float16) it may be an overflow, which float32
    avoids; in float32 it is the weights (--dtype float32 would change nothing, so it is not advised)."""
    name = str(dtype).removeprefix("torch.")
    if name == "float32":
        return "the weights hold NaN/inf (the run is already float32, where these weights do not overflow): check the checkpoint"
    return f"the weights hold NaN/inf or overflow in {name}: check the checkpoint, or try --dtype float32"


class NonFiniteOutput(ValueError):
    """The target's or the head's outputs hold NaN or inf (the pipeline adds the session and model)."""


def check_finite(columns: dict, head=None) -> None:
    """Raise NonFiniteOutput when a float column of a request's rows is not finite. The columns are numpy
    arrays already on the host (request_rows brought them there), so this adds no device sync.

    Where a drafter proposed nothing (draft_token -1) target_logprob is NaN by definition; draft_logprob is
    checked on the rows `head` marks ([R] bool: the head drafted them; None: every row)."""
    import numpy as np

    proposed = columns["draft_token"] >= 0
    target = [c for c in ["target_logprob", "actual_logprob"] + sorted(c for c in columns if c.startswith("p_accept_"))
              if c in columns]
    head = np.ones(len(proposed), dtype=bool) if head is None else head
    for who, names in (("the target's", target), ("the MTP head's", ["draft_logprob"])):
        for name in names:
            values = columns[name]
            if name == "target_logprob":
                values = values[proposed]
            elif name == "draft_logprob":
                values = values[head & proposed]
            if not np.isfinite(values).all():
                bad = int((~np.isfinite(values)).sum())
                raise NonFiniteOutput(f"{who} outputs are not finite ({bad} of {len(values)} {name} values NaN or inf)")


def replay_session(model: LoadedModel | None, requests, k_max: int, profiles, chunk_size: int,
                   drafters=None, recorder=None, observer: Observer | None = None, variants=None,
                   whatifs: HeadWhatIfs | None = None) -> list[RequestResult]:
    """Every request of one session, in order, each starting from the prefix it shares with the one before.
    model None: the model-free drafters of `drafters` alone (no weights, no target). recorder
    (routing.RouterRecorder) accumulates the session's router window sums. observer: hears each request start
    and its tokens as they are done (Observer.request, .tokens). whatifs: replay_request's."""
    out, carry = [], None
    for r, request in enumerate(requests):
        if observer is not None:
            observer.request(r)
        after = requests[r + 1].input_ids if r + 1 < len(requests) else None
        shared = shared_prefix(request.input_ids, after) if after is not None else 0
        if model is None:
            columns, fit = model_free_request(request, k_max, drafters, keep=shared)
            out.append(RequestResult(request.index, columns, fit))
            if observer is not None:
                observer.tokens(len(request.input_ids))
            continue
        keep_at = shared if after is not None else None
        if keep_at is not None and keep_at >= len(request.input_ids):
            keep_at = len(request.input_ids) - 1  # the next request extends this one: keep all but the last token
        columns, fit, carry = replay_request(model, request, k_max, profiles, chunk_size, carry=carry, keep_at=keep_at,
                                             drafters=drafters, keep=shared, recorder=recorder,
                                             on_tokens=observer.tokens if observer is not None else None,
                                             variants=variants, whatifs=whatifs,
                                             on_reused=observer.reused if observer is not None else None)
        out.append(RequestResult(request.index, columns, fit))
    return out


def count_records(path: Path) -> int:
    """Sessions a file will yield, counted cheaply (non-blank lines; a message-per-line file is one)."""
    import json

    from .sessions import GZIP_ERRORS, open_binary

    n, first = 0, None
    with open_binary(path) as f:
        try:
            for line in f:
                if line.strip():
                    if first is None:
                        first = line
                    n += 1
        except GZIP_ERRORS:
            pass  # a damaged .gz: the reader names it when it gets there; this is only the progress total
    if first is not None:
        try:
            head = json.loads(first)
            if isinstance(head, dict) and "role" in head and "messages" not in head:
                return 1
        except ValueError:
            pass
    return n


MAX_K = 32  # a chain longer than this is accepted to its end almost never, and costs [anchors, K] memory


def _check_options(opts: ReplayOptions) -> None:
    import re

    if opts.k < 1:
        raise OptionError(f"--k {opts.k}: draft depth must be at least 1")
    if opts.k > MAX_K:
        raise OptionError(f"--k {opts.k}: draft depth is at most {MAX_K} (acceptance at depth k is a product of k "
                          "acceptances; engines draft 1-8)")
    if opts.chunk_size < 1:
        raise OptionError(f"--chunk-size {opts.chunk_size}: must be at least 1")
    if opts.part_sessions < 1:
        raise OptionError(f"--part-sessions {opts.part_sessions}: must be at least 1 (sessions per part file)")
    if opts.on_error not in ("fail", "skip"):
        raise OptionError(f"--on-error {opts.on_error}: expected fail or skip")
    if opts.device_map not in (None, "auto"):
        raise OptionError(f"--device-map {opts.device_map}: only auto is supported (accelerate places the layers)")
    if opts.max_sessions is not None and opts.max_sessions < 1:
        raise OptionError(f"--max-sessions {opts.max_sessions}: must be at least 1")
    for theta in opts.draft_p_min:
        if not (isinstance(theta, (int, float)) and 0.0 <= theta <= 1.0):
            raise OptionError(f"--draft-p-min {theta}: a threshold is a probability, 0 to 1 (0: fixed K; 1: never draft)")
    if len(set(opts.draft_p_min)) != len(opts.draft_p_min):
        raise OptionError("--draft-p-min: a threshold repeats; give each once")
    if (opts.head_precisions or opts.draft_p_min) and "mtp" not in opts.drafters:
        which = "--head-precision" if opts.head_precisions else "--draft-p-min"
        raise OptionError(f"{which} re-runs or reads the MTP head, which --drafters {','.join(opts.drafters)} leaves "
                          "out; add mtp to --drafters")
    names = [p.name for p in opts.profiles]
    for name in names:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise OptionError(f"--sampling {name}=...: profile names are letters, digits and _ (they become column names)")
    if len(set(names)) != len(names):
        raise OptionError(f"--sampling: profile names repeat ({', '.join(names)}); give each a distinct name")
    if RECORDED in names:
        raise OptionError(f"--sampling {RECORDED}=...: '{RECORDED}' is the profile of each session's own sampler; "
                          "pick another name")
    if opts.recorded_with is not None and opts.recorded_with not in names:
        raise OptionError(f"--recorded-with {opts.recorded_with}: no such profile; name one of {', '.join(names)} "
                          "or give NAME=T,TOP_P,TOP_K[,...]")




def default_profiles(model_dir: Path) -> tuple:
    """The built-in profiles (the Qwen3.5 card's four and greedy) and the checkpoint's generation_config
    sampler when it has one (the sampler vLLM serves requests that set none with)."""
    from .target import BUILTIN_PROFILES, generation_config_profile

    generation = generation_config_profile(model_dir)
    return BUILTIN_PROFILES + ((generation,) if generation is not None else ())


def recorded_fallback(opts: ReplayOptions, model_dir: Path) -> tuple:
    """(profile, name) of the sampler for sessions without their own meta.sampling: the declared one,
    else the checkpoint's generation_config, else vLLM's neutral defaults (T = 1, nothing truncated)."""
    from .target import VLLM_DEFAULTS, generation_config_profile

    if opts.recorded_with is not None:
        return next(p for p in opts.profiles if p.name == opts.recorded_with), opts.recorded_with
    generation = generation_config_profile(model_dir)
    if generation is not None:
        return generation, "generation_config"
    return VLLM_DEFAULTS, "vllm_defaults"


def session_sampler(session, fallback, server_default):
    """(profile named `recorded`, source) for one session: its meta.sampling (vLLM SamplingParams names; a key
    absent or null takes the server's default, `server_default`: generation_config, else vLLM's) or, without
    one, the fallback."""
    from .sessions import SessionError
    from .target import SAMPLING_PARAMS, profile_from_params

    sampling = session.meta.get("sampling") if isinstance(session.meta, dict) else None
    if not isinstance(sampling, dict) or all(sampling.get(k) is None for k in SAMPLING_PARAMS):
        return fallback.renamed(RECORDED), "fallback"
    try:
        return profile_from_params(RECORDED, sampling, server_default), "session"
    except ValueError as e:
        raise SessionError(session.path, session.line, session.id, f"meta.{e}; fix it or drop meta.sampling") from None


def replay(files, model_dir: Path, out: Path, opts: ReplayOptions, bundled: bool = False, observer: Observer | None = None) -> Path:
    """Replay sessions into a run directory (PRODUCT.md's contract). Returns the run directory.

    Under torchrun every rank replays the sessions it owns (input index modulo world size) and
    writes their parts; rank 0 locks and prepares the directory, gathers counts and errors once
    every rank has finished, writes the manifest and lets go of the lock. Each rank groups its own
    sessions into parts named by their first session (parts.py), so the rows are the same whatever the
    number of ranks and --resume reads any grouping, though the part files differ. With opts.shard only the
    shard's sessions are replayed (shards.py); with opts.ray the replicas of a Ray cluster replay them and this
    process writes their parts (cluster.py).
    """
    from .sessions import check_inputs, resolve_inputs

    observer = observer or Observer()
    roster = drafter_roster(opts)  # --drafters: which need the target's weights (mtp, the hybrids), which do not
    model_free = not roster.needs_model
    if model_free and (opts.profiles or opts.recorded_with):
        raise OptionError(f"--sampling and --recorded-with score the target's sampler, which a replay of model-free "
                          f"drafters only ({', '.join(roster.names)}) does not run; add mtp to --drafters, or drop them")
    if model_free and opts.trees:
        raise OptionError(f"--tree grows the MTP head's tree drafts, which a replay of model-free drafters only "
                          f"({', '.join(roster.names)}) does not run; add mtp to --drafters, or drop --tree")
    opts = ReplayOptions(**{**opts.__dict__, "profiles": tuple(opts.profiles) or
                            (default_profiles(model_dir) if not model_free else ())})
    _check_options(opts)
    if any(str(f) == "-" for f in files) and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise OptionError("- (standard input) reaches only one of torchrun's processes; give the sessions as a file")
    if opts.ray is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise OptionError("--ray under torchrun: a Ray job is one process that drives the cluster's replicas; run it "
                          "without torchrun (or use torchrun without --ray)")
    fallback, fallback_name = recorded_fallback(opts, model_dir)
    files = resolve_inputs(files)  # directories expanded, "-" (standard input) copied once, missing paths refused
    check_inputs(files)  # every input holds a session, before any work
    cluster = None
    if opts.ray is not None:  # join (or start) the Ray cluster: how many GPUs a replica has decides the device
        from .cluster import connect

        cluster = connect(opts.ray, opts.device, model_free)
    try:
        return _replay(files, model_dir, out, opts, bundled, observer, roster, model_free, fallback, fallback_name,
                       cluster)
    finally:
        if cluster is not None:
            cluster.close()


def _replay(files, model_dir: Path, out: Path, opts: ReplayOptions, bundled: bool, observer: Observer, roster,
            model_free: bool, fallback, fallback_name: str, cluster) -> Path:
    """replay's steps once the inputs are checked (and, under --ray, the cluster joined)."""
    from . import tables
    from .errors import UserError

    if cluster is not None:
        device = cluster.device
    else:
        device = resolve_device(opts.device) if not model_free else "cpu"  # model-free drafters run on the CPU
    ranks = ranks_from_env(device)
    given = Path(ranks.from_rank0(str(out)))  # a default --out carries rank 0's timestamp to every rank
    # A symbolic link in --out (or above it) is followed once, here, and said: the run is written where it points.
    linked = given.resolve() != Path(os.path.abspath(given))
    out = given.resolve() if linked else given
    if ranks.world > 1 and device.startswith("cuda") and ":" not in device:
        device = f"cuda:{ranks.local_rank}"
    dtype = resolve_dtype(opts.dtype, device) if not model_free else None
    info = read_checkpoint(model_dir) if not model_free else None  # model-free: no weights, not even their headers
    plan = None
    if opts.shard is not None:  # the shard's sessions, from the whole input (rank 0 reads it, every rank gets it)
        plan = ranks.from_rank0(_shard_plan(files, opts, info, model_dir) if ranks.rank == 0 else None)
    serving = serving_for(opts, info)
    variants = head_variants(opts, info)
    if info is not None and opts.head_precisions:
        from .precisions import head_recipes

        head_recipes(info, opts.head_precisions)  # a shape a format cannot store is refused before anything is written

    # 1. Rank 0 locks the directory, checks it (fresh, --resume or --overwrite) against this run's identity.
    failure, manifest, lock = None, None, None
    if ranks.rank == 0:
        try:
            lock = tables.RunLock(out).acquire()
            run_identity = identity(info, files, opts, dtype, device, ranks, fallback, fallback_name, roster, model_dir,
                                    shard_plan=plan, serving=serving, variants=variants)
            manifest = start_manifest(out, opts, info, run_identity, bundled, ranks.world, model_dir, note=observer.note)
        except BaseException as e:  # nothing was written: let go of the directory (and of a directory we made)
            if lock is not None:
                lock.release()
            failure = e
    shared = ranks.from_rank0(portable(failure) if failure is not None and ranks.world > 1 else failure)
    if isinstance(shared, tables.RunComplete):  # --resume of a run that is complete: nothing to do (a nightly job)
        observer.note(str(shared))
        return out
    if failure is not None:
        raise failure  # rank 0: the error itself
    if shared is not None:
        raise shared
    if linked:
        observer.note(f"--out {given} resolves to {out} (through a symbolic link); the run is written there")

    try:
        # 2. This rank's sessions (or, under --ray, the cluster's).
        try:
            if cluster is not None:
                result = cluster.replay(files, out, opts, model_dir, dtype, observer, fallback, roster, plan)
            else:
                model = load_model(model_dir, device=device, dtype=dtype, device_map=opts.device_map,
                                   head_engine=opts.head_engine, serving=serving) if not model_free else None
                result = _replay_sessions(files, out, opts, model, ranks, observer, fallback, roster, model_dir, plan)
        except BaseException as e:  # every rank must reach the gather below, whatever happened here
            result = {"failure": e}
        results = ranks.gather({k: v if k != "failure" else portable(v) for k, v in result.items()})

        # 3. Rank 0 merges every rank's counts and errors into the manifest.
        finished = None
        if ranks.rank == 0:
            try:
                finish_manifest(out, manifest, results, files)
            except UserError as e:
                finished = e
        if ranks.world > 1:
            import torch.distributed as dist

            dist.barrier()
    finally:
        if lock is not None:
            lock.release()
    failures = [r["failure"] for r in results if r.get("failure") is not None]
    if "failure" in result:
        raise result["failure"]
    if failures:
        raise failures[0]
    if finished is not None:
        raise finished
    counts = manifest["counts"] if manifest is not None else {}
    if ranks.rank == 0 and counts.get("sessions_ok") == 0:
        from .errors import InputError

        raise InputError(f"{out}: no session was replayed ({counts.get('sessions_skipped', 0)} skipped; the reasons "
                         f"are under errors in {out / tables.MANIFEST}); fix the inputs, or pass others")
    return out


def _shard_plan(files, opts: ReplayOptions, info, model_dir: Path):
    """shards.plan_shard with the run's renderer (the tokens rule renders every session)."""
    from .rendering import Renderer
    from .shards import plan_shard

    renderer = None
    if opts.shard.by == "tokens":
        renderer = Renderer.from_model_dir(info.path if info is not None else model_dir,
                                           vocab_size=info.geometry.vocab_size if info is not None else None,
                                           overrides=opts.template)
    return plan_shard(files, opts.shard, renderer, opts.max_sessions)


def serving_for(opts: ReplayOptions, info: CheckpointInfo | None):
    """--serve-device and --fp8-activations resolved for the checkpoint (serving.serving_numerics); --fp8-activations
    for a checkpoint that is not block-FP8 is refused (vLLM quantises the activations of FP8 linears only)."""
    from .serving import serving_numerics

    quantized = info is not None and info.quantization is not None
    if opts.fp8_activations is not None and not quantized:
        what = "a model-free replay loads no weights" if info is None else "the checkpoint is not block-FP8"
        raise OptionError(f"--fp8-activations {opts.fp8_activations}: {what}, so no activation is quantised; "
                          "drop the option")
    return serving_numerics(opts.serve_device, opts.fp8_activations, quantized)


def replay_estimate(files, model_dir: Path, opts: ReplayOptions):
    """What `replay --dry-run` prints (estimate.Estimate): the work of replaying the input (its first --max-sessions
    sessions, those a resumed run finished included), priced by a calibration on the model. Writes nothing."""
    from .rendering import Renderer
    from .sessions import check_inputs, resolve_inputs

    roster = drafter_roster(opts)
    model_free = not roster.needs_model
    opts = ReplayOptions(**{**opts.__dict__, "profiles": tuple(opts.profiles) or
                            (default_profiles(model_dir) if not model_free else ())})
    _check_options(opts)
    fallback, _ = recorded_fallback(opts, model_dir) if not model_free else (None, None)
    files = resolve_inputs(files)
    check_inputs(files)
    model = None
    if not model_free:
        device = resolve_device(opts.device)
        model = load_model(model_dir, device=device, dtype=resolve_dtype(opts.dtype, device), device_map=opts.device_map,
                           head_engine=opts.head_engine)
    renderer = Renderer.from_model_dir(model.info.path if model is not None else model_dir,
                                       vocab_size=model.info.geometry.vocab_size if model is not None else None,
                                       overrides=opts.template)
    return _estimate(files, opts, model, renderer, lambda index: True, fallback, roster)


def _estimate(files, opts: ReplayOptions, model: LoadedModel | None, renderer, owns, fallback, roster, finished=None):
    """estimate.Estimate of the sessions _replay_owned will replay (the first --max-sessions, those `owns` takes,
    not finished before, rendering), priced by estimate.calibrate_replay on the model with the run's profiles and
    a fresh roster of its drafters (model None: the work alone)."""
    from .estimate import Estimate, ReplayWork, calibrate_replay, replay_work
    from .sessions import SessionError, Skipped, read_sessions

    heads = model.info.geometry.num_heads if model is not None else 1
    work = ReplayWork()
    for item in read_sessions(files, on_error="skip"):
        if opts.max_sessions is not None and item.index >= opts.max_sessions:
            break
        if isinstance(item, Skipped) or not owns(item.index):
            continue
        if finished and item.id in finished:
            work += ReplayWork(done_tokens=finished[item.id].counts["tokens_replayed"])
            continue
        try:
            work += replay_work(renderer.render(item), opts.k, opts.chunk_size, heads)
        except SessionError:
            continue  # the replay skips it (or stops at it)
    if model is None:
        return Estimate(work, k=opts.k, why_no_time="no time estimate (model-free drafters: no target runs)")
    drafters = drafter_roster(opts) if tuple(roster.names) != ("mtp",) else None
    profiles = tuple(opts.profiles) + (fallback.renamed(RECORDED),)
    try:
        rates = calibrate_replay(model, opts.k, profiles, opts.chunk_size, drafters)
    except NonFiniteOutput:  # the replay itself says so, naming the session and the fix
        return Estimate(work, k=opts.k, why_no_time="no time estimate (the model's outputs are not finite)")
    return Estimate(work, rates, k=opts.k)


def roster_draft_ks(name: str, k: int) -> tuple[int, ...]:
    from .drafters.roster import draft_ks

    return draft_ks(name, k)


def written_draft_ks(opts: ReplayOptions, roster, variants) -> list[int] | None:
    """The depth of every block of rows a replay writes per anchor (parts.py checks a part's rows by them): the
    roster's drafters, the trees and the stepwise layer rule (variants), Kmax for each --head-precision; None for an
    mtp-only run without them. What manifest.row_draft_ks reads back from run.json; a Ray job's driver checks its
    parts with it too (cluster.py)."""
    if tuple(roster.names) == ("mtp",) and not variants and not opts.head_precisions:
        return None
    return [kk for n in roster.names for kk in roster_draft_ks(n, opts.k)] + variants.draft_ks \
        + [opts.k] * len(opts.head_precisions)


def head_variants(opts: ReplayOptions, info: CheckpointInfo | None):
    """The run's head_variants.Variants: --tree's configurations, and the stepwise layer rule for a head with several
    MTP layers (none for a model-free replay)."""
    from .head_variants import Variants, variants_for

    if info is None:
        return Variants()
    if opts.trees and info.geometry.head != "mtp":
        # tree.py grows SGLang's trees from the Qwen heads' post-norm state; a NextN head (MLA or GLM's GQA, its
        # engine's fed-back state, docs/nextn.md) has no tree replay yet, so it is refused before any work.
        raise OptionError(f"--tree {opts.trees[0].name.removeprefix('tree:')}: tree drafts are replayed for the Qwen3.5-family "
                          f"MTP heads only, not {info.model_type}'s NextN head (docs/trees.md); drop --tree")
    return variants_for(tuple(opts.trees), info.geometry.num_layers, opts.k)


def drafter_roster(opts: ReplayOptions):
    """The run's drafters.roster.Roster from --drafters, --ngram and the --suffix-* options."""
    from .drafters.roster import Roster

    return Roster(tuple(opts.drafters), opts.k, opts.ngram, opts.suffix)


def _replay_sessions(files, out: Path, opts: ReplayOptions, model: LoadedModel | None, ranks: Ranks, observer: Observer,
                     fallback, roster=None, model_dir: Path | None = None, plan=None) -> dict:
    """Replay the sessions this rank owns into grouped parts (parts.PartWriter); whatever stops it (a failure,
    Ctrl-C), the sessions it finished are written first. Returns its counts and errors."""
    from . import parts

    writer = parts.PartWriter(out, max_sessions=opts.part_sessions)
    try:
        result = _replay_owned(files, out, opts, model, ranks, observer, fallback, roster, model_dir, writer, plan)
    except BaseException:
        try:
            writer.flush()
        except Exception:  # e.g. the disk that failed the run is still full: its own error is what the user sees
            pass
        raise
    writer.flush()
    return result


def _replay_owned(files, out: Path, opts: ReplayOptions, model: LoadedModel | None, ranks: Ranks, observer: Observer,
                  fallback, roster, model_dir: Path | None, writer, plan=None) -> dict:
    """Replay the sessions this rank owns; finished sessions of a resumed run are kept. Returns its counts and errors.

    A session is this rank's when its shard is this run's (plan: shards.ShardPlan, None without --shard) and its
    input index is the rank's. model None: a model-free replay (the roster's drafters alone, no target). When a
    drafter keeps state across requests (suffix decoding's global tree), every session of the input reaches it in
    input order: the ones this rank replays through `draft`, the others — another rank's or shard's, or a resumed
    run's finished ones — through `add_outputs` (their recorded outputs rendered again, or read back from the
    finished part; never replayed), so rows do not depend on the number of ranks or shards or on resuming."""
    import time

    from . import parts, tables
    from .estimate import request_works
    from .rendering import Renderer
    from .routing import RouterRecorder
    from .sessions import SessionError, Skipped, input_name, read_sessions, speculative_steps
    from .shards import session_key
    from .target import VLLM_DEFAULTS, generation_config_profile

    roster = roster or drafter_roster(opts)
    variants = head_variants(opts, model.info if model is not None else None)  # trees, the stepwise layer rule
    vocab = model.info.geometry.vocab_size if model is not None else None
    renderer = Renderer.from_model_dir(model.info.path if model is not None else model_dir, vocab_size=vocab,
                                       overrides=opts.template)
    server_default = (generation_config_profile(model.info.path) or VLLM_DEFAULTS) if model is not None else None
    draft_ks = written_draft_ks(opts, roster, variants)
    whatifs = head_whatifs(opts, model)
    finished = parts.finished_sessions(out, opts.k, draft_ks,
                                       on_damaged=lambda path, why:
                                       observer.note(f"{path}: {why}; recomputing its sessions")) if ranks.rank == 0 else None
    finished = ranks.from_rank0(finished)  # rank 0 checks (and repairs) the parts once, before anyone writes
    counts = dict.fromkeys(COUNT_KEYS + MAX_KEYS, 0)
    errors: list[dict] = []
    per_file = {input_name(f): 0 for f in files}
    total = sum(count_records(f) for f in files)
    if opts.max_sessions:
        total = min(total, opts.max_sessions)
    heads = model.info.geometry.num_heads if model is not None else 1
    mine = set(plan.indices) if plan is not None else None  # --shard: the input indices this shard owns

    def owns_index(index: int) -> bool:
        return ranks.owns(index) and (mine is None or index in mine)

    # The first line: the work ahead (this rank's share under torchrun), priced on this model; none for an observer
    # that drops it (the default: no calibration for it).
    if ranks.rank == 0 and type(observer).estimate is not Observer.estimate:
        observer.estimate(_estimate(files, opts, model, renderer, owns_index, fallback, roster, finished))
    observer.start(len([i for i in (plan.indices if plan is not None else range(total)) if ranks.owns(i)]))
    started, fresh_tokens = time.time(), 0
    recorder = RouterRecorder(model.target, opts.k + 1) if model is not None else None  # q = 1..Kmax+1 tokens a sequence
    if recorder is not None and not recorder.active:
        recorder.close()
        recorder = None

    def skip(index, path, line, session_id, message):
        errors.append({"index": index, "path": path, "line": line, "session_id": session_id, "message": message})
        counts["sessions_skipped"] += 1
        observer.warn(message)
        observer.session(session_id or "?", 0, skipped=True)

    def feed(requests):  # state only: the requests another rank or shard writes, or a resumed run kept
        for tokens, spans in requests:
            roster.add_outputs(tokens, spans)

    def owns(item) -> bool:
        return (plan is None or plan.owns(session_key(item))) and ranks.owns(item.index)

    for item in read_sessions(files, on_error=opts.on_error):
        if opts.max_sessions is not None and item.index >= opts.max_sessions:
            break
        per_file[item.path] += 1
        if not owns(item):
            if roster.stateful and not isinstance(item, Skipped):
                try:
                    feed([(r.input_ids, r.spans) for r in renderer.render(item).requests])
                except SessionError:
                    pass  # its owner skips it (or stops the run): it has no outputs either way
            continue
        if isinstance(item, Skipped):
            skip(item.index, item.path, item.line, item.session_id, item.message)
            continue
        c = finished[item.id].counts if item.id in finished else None  # a resumed run's finished session
        if c is not None and roster.stateful:
            feed(tables.part_requests(out, finished[item.id].part, item.id))
        if c is None:
            try:
                rendered = renderer.render(item)
                recorded, source = session_sampler(item, fallback, server_default) if model is not None else (None, None)
                speculative = speculative_steps(item)  # generate --speculative's own loop, for the report to compare
            except SessionError as e:
                if opts.on_error == "fail":
                    raise
                skip(item.index, e.path, e.line, e.session_id, str(e))
                continue
            observer.session_start(item.id, rendered.n_tokens, len(rendered.requests),
                                   work=request_works(rendered, opts.k, opts.chunk_size, heads))
            positions, requests, c = session_parts(model, item.id, item.index, rendered.requests, opts, roster, recorded,
                                                   source, speculative, recorder, observer, f"{item.path}:{item.line}",
                                                   variants, whatifs)
            writer.add(item.index, positions, requests)  # written with the sessions before and after it (parts.py)
            fresh_tokens += rendered.n_tokens
        counts["sessions_ok"] += 1
        for key, value in c.items():
            counts[key] = max(counts[key], value) if key in MAX_KEYS else counts[key] + value
        observer.session(item.id, c["tokens_replayed"], skipped=False)
    return {"counts": counts, "errors": errors, "per_file": per_file, "fresh_tokens": fresh_tokens,
            "wall_s": time.time() - started, "drafting": roster.timing() if tuple(roster.names) != ("mtp",) else {}}


def session_parts(model: LoadedModel | None, session_id: str, index: int, requests, opts: ReplayOptions, roster,
                  recorded=None, source: str | None = None, speculative=None, recorder=None,
                  observer: Observer | None = None, where: str = "", variants=None,
                  whatifs: HeadWhatIfs | None = None) -> tuple:
    """(positions table, requests table, counts) of one rendered session: what each process of a replay — and each
    replica of a Ray job (cluster.py) — does with a session it owns. index: its input index (requests.parquet
    `session_index`); recorded, source: its `recorded` sampler and where that came from (session_sampler; None
    without a target); speculative: generate --speculative's steps (sessions.speculative_steps); where: its
    file:line, for the one-line error of a non-finite output; variants: head_variants.Variants (trees, the stepwise
    layer rule) replayed beside the chain; whatifs: the head at other precisions and the confidence column
    (`head_whatifs`, built once per process or replica)."""
    from . import tables
    from .head_variants import Variants

    variants = variants if variants is not None else Variants()
    # an mtp-only run without variants is written as before (no drafter columns)
    with_drafters = tuple(roster.names) != ("mtp",) or bool(variants)
    names = [p.name for p in opts.profiles] + [RECORDED] if model is not None else []
    profiles = tuple(opts.profiles) + (recorded,) if model is not None else ()
    try:
        per_request = replay_session(model, requests, opts.k, profiles, opts.chunk_size,
                                     drafters=roster if with_drafters else None, recorder=recorder, observer=observer,
                                     variants=variants, whatifs=whatifs)
    except NonFiniteOutput as e:
        raise CheckpointError(f"{model.info.path}: {e} in session {session_id} ({where}); "
                              f"{non_finite_advice(model.dtype)}") from None
    positions = tables.positions_table(session_id, [(r.index, r.columns) for r in per_request], names,
                                       drafters=list(roster.names) + variants.names if with_drafters else None,
                                       target=model is not None,
                                       precisions=list(whatifs.names) if whatifs is not None else None,
                                       confidence=whatifs is not None and whatifs.confidence)
    table = tables.requests_table(session_id, requests, [r.fit for r in per_request], names,
                                  {"source": source, **recorded.as_dict()} if model is not None else None,
                                  speculative, routing=recorder.take() if recorder is not None else None,
                                  session_index=index)
    counts = {"requests": len(requests), "tokens_replayed": sum(len(r.input_ids) for r in requests),
              "scored_tokens": sum(sp.end - sp.start + 1 for r in requests for sp in r.spans), "rows": positions.num_rows,
              "anchors": sum(max(sp.end - max(sp.start, 1), 0) for r in requests for sp in r.spans),
              "max_request_tokens": max((len(r.input_ids) for r in requests), default=0)}
    return positions, table, counts
