"""The estimate: how much work a replay or a generate will do, and how long it takes on this device.

Printed by `sessions`, as the first line of `replay` and `generate`, and alone by their `--dry-run`; the
progress line's ETA is counted in the same work (progress.py), so it starts at the estimate and moves
with the measured speed.

1. Work, counted from the rendered sessions exactly as the run will compute it (pure arithmetic, no model;
   tests/test_estimate.py checks each count against what the run reports):

   replay (pipeline.replay_session, replay_request, target.prefill, mtp.MtpHead.row_pass and .chain)
       prefill      the tokens the target computes: each request's tokens after the prefix it shares with
                    the request before (the state after that prefix is carried over: `reused`)
       drafts       rows: every anchor (a scored position the head drafts from) times its depth <= K; each
                    is a head step, an lm_head argmax, and the target's lm_head reductions for every profile
       pairs        attention query-key pairs, what grows with the context: the target's over its prefill
                    chunks (per full-attention layer and head), the head's over its row chunks and its
                    chain blocks (per head)
   generate (generation.generate and _complete: windows of sessions, batches sorted by prompt length)
       prefill      every turn's whole prompt, left-padded to the longest of its batch
       steps        decode forwards: one per generated token after the first, for the longest turn of the
                    batch (rows that finish leave it); how long the model's turns will be is not known, so
                    two cases: each turn as long as the recorded one (capped at --max-new-tokens), and
                    every turn running to --max-new-tokens. Under --speculative, verify steps: K + 1
                    tokens a step at best, 1 at worst.
       pairs        the prefill's and each decode forward's attention pairs

2. Rates, seconds per unit of that work on the loaded model and device (`calibrate_replay`,
   `calibrate_generate`): the run's own code timed on a few hundred synthetic tokens — replay_request on
   requests of two lengths with a short scored span and on one with a long span (seconds per request, per
   prefilled token, per draft row), generate_batch on prompts of two lengths and with one and nine new
   tokens (per batch, per prefilled token, per decode forward) — and the head's attention kernel timed on a
   long context (per query-key pair and head: a long context's cost comes from its pairs, which the short
   calibration cannot show). One short warm-up call first (first calls allocate). A process calibrates once
   for the same model, device and options (tests and benchmarks replay many times).

3. The estimate: seconds = calls x call_s + prefill x token_s + drafts x draft_s + steps x step_s + pairs x
   pair_s, plus (replay) every term its options add (estimate_terms.py: each what-if precision, the thresholds'
   confidence, the trees, each calibrated on its own and shown by `replay --dry-run` one line each), and the range [LOW x seconds, HIGH x seconds] (generate: LOW x its shorter case, HIGH x its
   longer one). LOW and HIGH come from benchmarks/estimate_bench.py on a shared 2-core CPU, where other jobs
   change the speed from minute to minute (docs/estimates-and-progress.md: figures). It says it is an estimate.
"""

from __future__ import annotations

import time
from dataclasses import astuple, dataclass, fields

LOW, HIGH = 0.7, 1.6  # the range around the priced work (module docstring 3; benchmarks/estimate_bench.py)
CALIBRATION_SHORT, CALIBRATION_TOKENS = 64, 192  # the synthetic requests' (or prompts') lengths
CALIBRATION_SPAN = 128  # scored tokens of the long-span request
ATTENTION_QUERIES, ATTENTION_KEYS = 128, 4096  # the attention kernel's timing shape
TERM_REPEATS = 2  # a term's timings, each beside the base's: a difference of two timings needs the same minute


# ---------------------------------------------------------------------------------------------
# 1. Work


def _add(a, b):
    return type(a)(*(x + y for x, y in zip(astuple(a), astuple(b))))


@dataclass(frozen=True)
class ReplayWork:
    """What a replay computes, summed over sessions (`+`)."""

    sessions: int = 0
    requests: int = 0
    tokens: int = 0  # every request's tokens: what the progress line counts as replayed
    prefill: int = 0  # ... that the target computes
    reused: int = 0  # ... carried over from the request before (tokens - prefill)
    anchors: int = 0  # positions the head drafts from
    drafts: int = 0  # rows: anchors x their depths (<= K)
    target_pairs: int = 0  # query-key pairs of the prefill chunks, per full-attention layer and head
    head_pairs: int = 0  # query-key pairs of the head's row pass and chain, per head
    anchor_positions: int = 0  # the anchors' positions summed: a tree's draft queries attend to that many rows
    done_tokens: int = 0  # tokens of sessions a resumed run finished before (not replayed again)
    tool_call_tokens: int = 0  # scored tokens in tool-call segments: what --grammar tools scans (estimate_terms)

    __add__ = _add


@dataclass(frozen=True)
class GenerateWork:
    """What a generate computes, summed over sessions (`+`). *_low: every turn as long as the recorded one
    (capped at --max-new-tokens); *_high: every turn running to --max-new-tokens (module docstring 1)."""

    sessions: int = 0
    turns: int = 0
    batches: int = 0  # generate_batch calls (speculative: turns)
    prompt: int = 0  # prompt tokens (every turn's whole prompt: turns share no prefix)
    prefill: int = 0  # tokens the target computes: prompts padded to the longest of their batch
    prefill_pairs: int = 0  # query-key pairs of the prefill chunks, per full-attention layer and head
    generated_low: int = 0  # tokens generated
    generated_high: int = 0
    steps_low: int = 0  # decode forwards (speculative: verify steps, K + 1 tokens each at best)
    steps_high: int = 0  # ... (speculative: one token a step)
    decode_pairs_low: int = 0  # query-key pairs of the decode forwards, per full-attention layer and head
    decode_pairs_high: int = 0

    __add__ = _add


def prefill_chunks(start: int, n: int, chunk_size: int, keep_at: int | None = None) -> list[tuple[int, int]]:
    """The chunks target.prefill computes: [start, n) cut every chunk_size tokens and at keep_at."""
    bounds = sorted(set(list(range(start, n, chunk_size)) + ([keep_at] if keep_at is not None else []) + [n]))
    return list(zip(bounds[:-1], bounds[1:]))


def chunk_pairs(chunks) -> int:
    """Query-key pairs of causal chunks over a cache: chunk [c0, c1) attends to keys [0, c1)."""
    return sum((c1 - c0) * c1 for c0, c1 in chunks)


def chain_pairs(anchors: list[int], depths: list[int], k: int, num_heads: int) -> int:
    """Query-key pairs of mtp.MtpHead.chain over one request's anchors (ascending) and depths: at step s >= 2
    the anchors still drafting, in blocks of mtp.anchor_block's size, each block's queries against the
    rows before its last anchor and the block's own chain rows."""
    from ..model.mtp import ATTENTION_BUDGET, anchor_block

    pairs = 0
    for step in range(2, k + 1):
        alive = [p for p, d in zip(anchors, depths) if d >= step]
        if not alive:
            break
        n_chain = step - 1
        block = anchor_block(num_heads, max(alive), n_chain, ATTENTION_BUDGET)
        for b0 in range(0, len(alive), block):
            b = alive[b0 : b0 + block]
            pairs += len(b) * (max(b) + len(b) * n_chain)
    return pairs


def replay_work(rendered, k: int, chunk_size: int, num_heads: int) -> ReplayWork:
    """One rendered session's ReplayWork (the sum of request_works)."""
    total = ReplayWork(sessions=1)
    for w in request_works(rendered, k, chunk_size, num_heads):
        total += w
    return total


def request_works(rendered, k: int, chunk_size: int, num_heads: int) -> list[ReplayWork]:
    """One rendered session's work, request by request as pipeline.replay_session runs them: each request
    starts from the state after the prefix it shares with the one before (`keep_at` of that one, when it is at
    least 2 tokens and leaves a token to compute), and the head's rows before that prefix are reused."""
    from ..sessions.rendering import TOOL_CALL
    from .requests import shared_prefix

    requests = rendered.requests
    out = []
    carry = 0
    for r, request in enumerate(requests):
        n = len(request.input_ids)
        after = requests[r + 1].input_ids if r + 1 < len(requests) else None
        keep_at = None
        if after is not None:
            keep_at = min(shared_prefix(request.input_ids, after), n - 1)
        start = carry if 2 <= carry < n else 0  # replay_request: a carry must leave a token and hold two
        if keep_at is not None and not (keep_at >= 2 and keep_at >= start):
            keep_at = None
        rows_from = start - 1 if start else 0  # the head's rows 0..start-2 come with the carry
        anchors, depths = [], []
        for sp in request.spans:
            for p in range(max(sp.start, 1), sp.end):
                anchors.append(p)
                depths.append(min(k, sp.end - p))
        out.append(ReplayWork(
            requests=1, tokens=n, prefill=n - start, reused=start, anchors=len(anchors), drafts=sum(depths),
            anchor_positions=sum(anchors), tool_call_tokens=sum(sp.segments.count(TOOL_CALL) for sp in request.spans),
            target_pairs=chunk_pairs(prefill_chunks(start, n, chunk_size, keep_at)),
            head_pairs=chunk_pairs(prefill_chunks(rows_from, n - 1, chunk_size)) + chain_pairs(anchors, depths, k, num_heads)
            # the chain again over the anchors whose draft reaches past the end of the turn, one step deeper
            # (requests._head_past_end_tokens: the draft an engine counts past the end-of-turn token)
            + chain_pairs([p for p, d in zip(anchors, depths) if d < k], [d + 1 for d in depths if d < k], k, num_heads)))
        carry = keep_at or 0
    return out


@dataclass(frozen=True)
class TurnShape:
    """One turn to generate, as the estimate sees it."""

    prompt: int  # its prompt's tokens
    recorded: int  # the recorded turn's tokens (through its end-of-turn token)


def turn_shapes(rendered) -> list[TurnShape]:
    """The turns generation.turn_prompts makes of a rendered session, in its order."""
    return [TurnShape(span.start, span.end - span.start + 1) for request in rendered.requests for span in request.spans]


def generate_work(sessions: list[list[TurnShape]], batch_size: int, chunk_size: int, max_new_tokens: int,
                  speculative: int | None = None, window: int | None = None) -> GenerateWork:
    """GenerateWork of sessions (each a list of its turns) in input order, batched as generation.generate does:
    sessions are gathered until `window` turns are pending (generation.WINDOW_BATCHES batches; one turn under
    --speculative), their turns sorted by prompt length and cut into batches of batch_size."""
    from .decoding import WINDOW_BATCHES

    window = window or (batch_size * WINDOW_BATCHES if speculative is None else 1)
    total = GenerateWork()
    pending: list[TurnShape] = []

    def flush():
        nonlocal total
        order = sorted(range(len(pending)), key=lambda i: pending[i].prompt)  # generation._complete's order
        step = 1 if speculative is not None else batch_size
        for b0 in range(0, len(order), step):
            total += _batch_work([pending[i] for i in order[b0 : b0 + step]], chunk_size, max_new_tokens, speculative)

    for turns in sessions:
        total += GenerateWork(sessions=1)
        pending.extend(turns)
        if len(pending) >= window:
            flush()
            pending = []
    if pending:
        flush()
    return total


def _batch_work(batch: list[TurnShape], chunk_size: int, max_new_tokens: int, speculative: int | None) -> GenerateWork:
    """One batch of generation.generate_batch (or one speculative_turn)."""
    from .decoding import MIN_PREFILL_CHUNK

    B = len(batch)
    L = max(t.prompt for t in batch)
    low = [max(1, min(t.recorded, max_new_tokens)) for t in batch]
    if speculative is not None:  # one turn: prefill in chunks of chunk_size, then verify steps of K + 1 tokens
        (g,) = low
        chunks = prefill_chunks(0, L, chunk_size)
        steps_low, steps_high = -(-(g - 1) // (speculative + 1)), max_new_tokens - 1
        per_step = 2 * (speculative + 1)  # the verify forward, and the commit when a draft is rejected
        return GenerateWork(turns=1, batches=1, prompt=L, prefill=L, prefill_pairs=chunk_pairs(chunks), generated_low=g,
                            generated_high=max_new_tokens, steps_low=steps_low, steps_high=steps_high,
                            decode_pairs_low=per_step * sum(L + j for j in range(0, g, speculative + 1)),
                            decode_pairs_high=per_step * sum(L + j for j in range(max_new_tokens)))
    chunk = max(MIN_PREFILL_CHUNK, chunk_size // B)
    chunks = prefill_chunks(0, L, chunk)

    def decode(lengths):  # forwards after the first token: rows still generating at each, against L + j keys
        return (max(lengths) - 1, sum(sum(1 for g in lengths if g > j) * (L + j) for j in range(1, max(lengths))))

    steps_low, pairs_low = decode(low)
    steps_high, pairs_high = decode([max_new_tokens] * B)
    return GenerateWork(turns=B, batches=1, prompt=sum(t.prompt for t in batch), prefill=B * L, prefill_pairs=B * chunk_pairs(chunks),
                        generated_low=sum(low), generated_high=B * max_new_tokens, steps_low=steps_low,
                        steps_high=steps_high, decode_pairs_low=pairs_low, decode_pairs_high=pairs_high)


# ---------------------------------------------------------------------------------------------
# 2. Rates


@dataclass(frozen=True)
class Rates:
    """Seconds per unit of work on the loaded model and device, measured by a calibration."""

    device: str
    tokens: int  # synthetic tokens the calibration ran
    token_s: float  # per token the target prefills (replay: with the head's row there)
    pair_s: float  # per attention query-key pair and head
    full_layers: int  # the target's full-attention layers
    heads: int  # attention heads (the target's and the head's)
    call_s: float = 0.0  # per request (replay) or per batch (generate): what one call costs whatever its size
    draft_s: float = 0.0  # replay: per draft row
    step_s: float = 0.0  # generate: per decode forward of a batch (or per speculative step)
    terms: tuple = ()  # replay: estimate_terms.Term, what the options run beside the base replay (what-ifs, trees)


def full_attention_layers(text_config: dict) -> int:
    """The target's full-attention layers: layer_types, or every full_attention_interval-th layer (transformers'
    Qwen3.5 configs; cost.py reads them the same way)."""
    types = text_config.get("layer_types")
    if types:
        return sum(1 for t in types if t == "full_attention")
    interval = int(text_config.get("full_attention_interval", 4))
    return sum(1 for i in range(int(text_config["num_hidden_layers"])) if (i + 1) % interval == 0)


def _sync(device: str) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn, device: str) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def _pair_seconds(model) -> float:
    """Seconds per query-key pair and head: the head's attention kernel (mtp.MtpHead._attend, with its row mask)
    on ATTENTION_QUERIES queries against ATTENTION_KEYS keys, the best of two after a warm-up."""
    import torch

    head, g = model.head, model.head.geometry
    gen = torch.Generator().manual_seed(0)

    def tensor(heads, n):
        return torch.randn(heads, n, g.head_dim, generator=gen).to(device=head.device, dtype=head.dtype)

    q, kv = ATTENTION_QUERIES, ATTENTION_KEYS
    query, key, value = tensor(g.num_heads, q), tensor(g.num_kv_heads, kv), tensor(g.num_kv_heads, kv)
    positions = torch.arange(kv, device=head.device)
    mask = head._row_mask(positions[kv - q :], positions)
    with torch.no_grad():
        head._attend(query, key, value, mask)
        best = min(_timed(lambda: head._attend(query, key, value, mask), head.device) for _ in range(2))
    return best / (q * kv * g.num_heads)


def _synthetic_ids(n: int, vocab: int, seed: int = 0) -> list[int]:
    import torch

    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _solve(short: tuple[int, float], long: tuple[int, float]) -> tuple[float, float]:
    """(seconds per token, per call) from two timings (tokens, seconds) of calls of two sizes; a per-token cost
    at least a quarter of the larger call's seconds per token (two timings on a busy machine can come out in
    any order)."""
    (n1, t1), (n2, t2) = short, long
    per_token = max((t2 - t1) / (n2 - n1), 0.25 * t2 / n2)
    return per_token, max(t1 - n1 * per_token, 0.0)


_CALIBRATED: dict = {}  # (what the rates depend on) -> Rates: one calibration per process for the same model and options


def _model_key(model) -> tuple:
    return (str(model.info.path), model.info.config_sha256, str(model.device), str(model.dtype))


def calibrate_replay(model, k: int, profiles, chunk_size: int, drafters=None, terms=()) -> Rates:
    """terms: estimate_terms.TermSpec of the run's options (estimate_terms.extra_terms), each priced beside the base."""
    key = ("replay", *_model_key(model), k, tuple(profiles), chunk_size, tuple(drafters.names) if drafters else None,
           tuple(t.name for t in terms))
    if key not in _CALIBRATED:
        _CALIBRATED[key] = _calibrate_replay(model, k, profiles, chunk_size, drafters, terms)
    return _CALIBRATED[key]


def calibrate_generate(model, settings, batch_size: int) -> Rates:
    key = ("generate", *_model_key(model), settings, batch_size)
    if key not in _CALIBRATED:
        _CALIBRATED[key] = _calibrate_generate(model, settings, batch_size)
    return _CALIBRATED[key]


def _calibrate_replay(model, k: int, profiles, chunk_size: int, drafters=None, terms=()) -> Rates:
    """Rates of a replay: pipeline.replay_request timed on synthetic requests of CALIBRATION_SHORT and
    CALIBRATION_TOKENS tokens with a 2-token scored span (the best of two each: per token, per request), and of
    CALIBRATION_TOKENS with a CALIBRATION_SPAN one (per draft row); the attention they did is priced by
    _pair_seconds and taken out first. drafters: a fresh drafters.roster.Roster of the run's drafters, never the
    run's own, whose suffix tree would learn the synthetic tokens. Each term (estimate_terms.TermSpec) is timed on
    the same three requests with it switched on, the best of two each, and priced by the difference
    (estimate_terms.calibrate_term)."""
    from ..sessions.rendering import TEXT, RenderedSession, Request, Span
    from .estimate_terms import Term, calibrate_term, term_pairs
    from .requests import replay_request

    n = CALIBRATION_TOKENS
    ids = _synthetic_ids(n, model.info.geometry.vocab_size)
    heads, full = model.head.geometry.num_heads, full_attention_layers(model.info.text_config)
    pair_s = _pair_seconds(model)

    def run(length: int, span: int, repeats: int = 1, spec=None) -> tuple[float, ReplayWork]:
        req = Request(0, ids[:length], (Span(length - span, length - 1, 1, bytes([TEXT]) * span),))
        w = replay_work(RenderedSession(None, (req,)), k, chunk_size, heads)

        def once():
            kwargs = {"drafters": drafters, **(spec.kwargs() if spec is not None else {})}
            return _timed(lambda: replay_request(model, req, k, profiles, chunk_size, **kwargs), model.device)

        t = min(once() for _ in range(repeats))
        pairs = w.target_pairs * full + w.head_pairs + (term_pairs(spec, w) if spec is not None else 0)
        return max(t - pairs * heads * pair_s, 0.0), w

    run(32, 2)  # warm-up
    (t_a, _), (t_b, w_b) = run(CALIBRATION_SHORT, 2, 2), run(n, 2, 2)
    t_c, w_c = run(n, CALIBRATION_SPAN)
    token_s, call_s = _solve((CALIBRATION_SHORT, t_a), (n, t_b))
    draft_s = max(t_c - t_b, 0.0) / max(w_c.drafts - w_b.drafts, 1)
    priced = []
    for spec in terms:  # each term against the base timed beside it (the same minute of a busy machine)
        if spec.direct is not None:  # seconds per row, or (per row, per session)
            got = spec.direct()
            row_s, session_s = got if isinstance(got, tuple) else (got, 0.0)
            priced.append(Term(spec.name, spec.what, row_s=row_s, per=spec.per, scale=spec.scale, session_s=session_s))
            continue
        run(32, 2, spec=spec)  # warm-up: a what-if head's or a tree's first call allocates
        timed = {}
        for shape in ((n, 2), (n, CALIBRATION_SPAN)):
            pairs = [(run(*shape), run(*shape, spec=spec)) for _ in range(TERM_REPEATS)]
            timed["long" if shape[1] == 2 else "span"] = (min(b for (b, _), _ in pairs), min(t for _, (t, _) in pairs),
                                                          pairs[0][1][1])
        priced.append(calibrate_term(spec, timed))
    tokens = 32 + 2 * CALIBRATION_SHORT + 3 * n + sum(32 + 4 * TERM_REPEATS * n for t in terms if t.direct is None)
    return Rates(device=str(model.device), tokens=tokens, token_s=token_s, pair_s=pair_s,
                 full_layers=full, heads=heads, call_s=call_s, draft_s=draft_s, terms=tuple(priced))


def _calibrate_generate(model, settings, batch_size: int) -> Rates:
    """Rates of a generate: generation.generate_batch timed with one new token on one prompt of CALIBRATION_SHORT and
    one of CALIBRATION_TOKENS tokens (the best of two each: per prompt token, per batch), and on batch_size 32-token
    prompts with one and with nine new tokens (per decode forward); under --speculative, speculative_turn on one
    32-token prompt with one and with nine (per verify step, as many as the loop took). No end-of-turn id stops
    them (the settings' are dropped), so every forward counted runs."""
    from dataclasses import replace

    from .decoding import TurnPrompt, generate_batch, speculative_turn

    vocab = model.info.geometry.vocab_size
    heads, full = model.head.geometry.num_heads, full_attention_layers(model.info.text_config)
    pair_s = _pair_seconds(model)
    n, short = CALIBRATION_TOKENS, 32
    spec = settings.speculative is not None

    def prompts(count: int, length: int) -> list[TurnPrompt]:
        return [TurnPrompt("calibration", i, tuple(_synthetic_ids(length, vocab, seed=i + 1))) for i in range(count)]

    def run(batch, new_tokens: int, repeats: int = 1):
        s = replace(settings, max_new_tokens=new_tokens, eos_ids=frozenset())
        out = []

        def once():
            out.clear()
            if spec:
                out.extend(speculative_turn(model, p, s) for p in batch)
            else:
                out.extend(generate_batch(model, batch, s))

        return min(_timed(once, model.device) for _ in range(repeats)), out

    def prefill(length: int) -> tuple[int, float]:
        t, _ = run(prompts(1, length), 1, 2)
        return length, max(t - chunk_pairs(prefill_chunks(0, length, settings.chunk_size)) * full * heads * pair_s, 0.0)

    run(prompts(1, short), 2)  # warm-up
    token_s, call_s = _solve(prefill(CALIBRATION_SHORT), prefill(n))
    rows = 1 if spec else max(1, batch_size)
    batch = prompts(rows, short)
    (t_one, _), (t_nine, nine) = run(batch, 1), run(batch, 9)
    steps = max(len(nine[0].anchors), 1) if spec else 8
    step_s = max(t_nine - t_one, 0.0) / steps
    tokens = short + 2 * (CALIBRATION_SHORT + n) + 2 * rows * short + rows * 9
    return Rates(device=str(model.device), tokens=tokens, token_s=token_s, pair_s=pair_s, full_layers=full, heads=heads,
                 call_s=call_s, step_s=step_s)


# ---------------------------------------------------------------------------------------------
# 3. The estimate


def replay_seconds(work: ReplayWork, rates: Rates, terms: bool = True) -> float:
    """The priced work (module docstring 3): the base replay and, unless terms is False, every term the options add
    (estimate_terms: what-if heads, thresholds, trees)."""
    from .estimate_terms import term_seconds

    pairs = work.target_pairs * rates.full_layers + work.head_pairs
    extra = sum(term_seconds(t, work, rates) for t in rates.terms) if terms else 0.0
    return (work.requests * rates.call_s + work.prefill * rates.token_s + work.drafts * rates.draft_s
            + pairs * rates.heads * rates.pair_s + extra)


def replay_parts(work: ReplayWork, rates: Rates) -> tuple[float, float, int]:
    """(seconds of its prefill, seconds of all of it, its prefill tokens) of one request's work: what the progress
    line credits as the request's chunks are computed, and once it has ended."""
    prefill_s = work.prefill * rates.token_s + work.target_pairs * rates.full_layers * rates.heads * rates.pair_s
    return prefill_s, replay_seconds(work, rates), work.prefill


def generate_seconds(work: GenerateWork, rates: Rates) -> tuple[float, float]:
    """(the shorter case, the longer case) of the priced work."""
    base = (work.batches * rates.call_s + work.prefill * rates.token_s
            + work.prefill_pairs * rates.full_layers * rates.heads * rates.pair_s)
    attention = rates.full_layers * rates.heads * rates.pair_s
    return (base + work.steps_low * rates.step_s + work.decode_pairs_low * attention,
            base + work.steps_high * rates.step_s + work.decode_pairs_high * attention)


def generate_prices(work: GenerateWork, rates: Rates) -> tuple[float, float]:
    """(seconds per prompt token, per generated token) of the shorter case: what generate's progress counts its
    work in (its padding and attention spread over the prompt tokens, its decode forwards over the tokens)."""
    attention = rates.full_layers * rates.heads * rates.pair_s
    prefill = work.batches * rates.call_s + work.prefill * rates.token_s + work.prefill_pairs * attention
    decode = work.steps_low * rates.step_s + work.decode_pairs_low * attention
    return prefill / max(work.prompt, 1), decode / max(work.generated_low, 1)


@dataclass(frozen=True)
class Estimate:
    """The work of a replay or a generate, and its time on this device when a calibration priced it."""

    work: ReplayWork | GenerateWork
    rates: Rates | None = None  # None: no time (model-free drafters run no target; --no-estimate)
    k: int | None = None  # replay: the draft depth Kmax
    max_new_tokens: int | None = None  # generate
    why_no_time: str | None = None  # said in place of the time

    @property
    def seconds(self) -> tuple[float, float] | None:
        """The range [LOW x the priced work, HIGH x it] (generate: its shorter and longer case)."""
        if self.rates is None:
            return None
        if isinstance(self.work, ReplayWork):
            s = replay_seconds(self.work, self.rates)
            return LOW * s, HIGH * s
        lo, hi = generate_seconds(self.work, self.rates)
        return LOW * lo, HIGH * hi

    @property
    def point_s(self) -> float | None:
        """The priced work itself (generate: the shorter case), the ETA's first figure."""
        if self.rates is None:
            return None
        if isinstance(self.work, ReplayWork):
            return replay_seconds(self.work, self.rates)
        return generate_seconds(self.work, self.rates)[0]


def duration(seconds: float) -> str:
    """A duration as a person says it: 45 s, 3 min 10 s, 2 h 05 min."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def short_count(n: float) -> str:
    """Three digits: 12,345 -> 12.3k, 2,075,722 -> 2.08M (counts below 10,000 in full)."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size and n >= 10_000:
            value = n / size
            return f"{value:.{2 if value < 10 else 1 if value < 100 else 0}f}{unit}"
    return f"{int(n):,}"


def estimate_line(est: Estimate, label: str = "estimate") -> str:
    """The estimate as one line (label first):

        estimate: 2.08M tokens to prefill (+6.71M reused from shared prefixes), 241k anchors to draft (K <= 4),
        160 sessions · 1 h 50 min - 3 h 10 min on cpu (an estimate, calibrated on 416 tokens of this model)
    """
    from ..wording import plural

    w = est.work
    if isinstance(w, ReplayWork):
        reused = f" (+{short_count(w.reused)} reused from shared prefixes)" if w.reused else ""
        what = (f"{short_count(w.prefill)} tokens to prefill{reused}, {short_count(w.anchors)} anchors to draft "
                f"(K <= {est.k}), {plural(w.sessions, 'session')}")
    else:
        generated = (f"{short_count(w.generated_low)}" if w.generated_low == w.generated_high else
                     f"{short_count(w.generated_low)}-{short_count(w.generated_high)}")
        what = (f"{short_count(w.prompt)} prompt tokens to prefill, {generated} tokens to generate "
                f"({plural(w.turns, 'turn')} as long as the recorded ones - all {est.max_new_tokens:,} "
                f"--max-new-tokens), {plural(w.sessions, 'session')}")
    seconds = est.seconds
    if seconds is None:
        return f"{label}: {what}" + (f" · {est.why_no_time}" if est.why_no_time else "")
    lo, hi = seconds
    r = est.rates
    return (f"{label}: {what} · {duration(lo)} - {duration(hi)} on {r.device} (an estimate, calibrated on "
            f"{r.tokens:,} tokens of this model)")


def breakdown_lines(est) -> list[str]:
    """The estimate's breakdown (estimate.Estimate of a replay priced with its terms), one line each: the base
    replay, then every term, each with its priced seconds (the point; the range is the estimate line's)."""
    from .estimate_terms import term_seconds

    w, r = est.work, est.rates
    if r is None or not isinstance(w, ReplayWork) or not r.terms:
        return []
    base = replay_seconds(w, r, terms=False)
    lines = [f"  base replay: {short_count(w.prefill)} tokens, {short_count(w.drafts)} draft rows · {duration(base)}"]
    for t in r.terms:
        lines.append(f"  + {t.name}: {t.what} · {duration(term_seconds(t, w, r))}")
    return lines


def survey_estimates(model_dir, replay: ReplayWork, generate: list, device: str = "auto", calibrate: bool = True,
                     k: int = 4, chunk_size: int = 2048, batch_size: int = 8, max_new_tokens: int = 1024,
                     template=None) -> tuple[Estimate, Estimate]:
    """What `sessions` prints: the estimates of a replay (ReplayWork, at the defaults: --k 4, --chunk-size 2048) and of
    a generate (the sessions' turns as TurnShape lists; --batch-size 8, --max-new-tokens 1024, the checkpoint's
    sampler) of the sessions surveyed, each priced by its calibration on the model loaded on `device` (calibrate
    False: the work alone, no weights loaded)."""
    from ..drafting.acceptance import NonFiniteOutput
    from ..model.loading import load_model, resolve_device, resolve_dtype
    from ..model.target import RECORDED
    from ..sessions.rendering import Renderer
    from .decoding import NonFiniteLogits, Settings, resolve_profile
    from .options import ReplayOptions, default_profiles, recorded_fallback

    work = generate_work(generate, batch_size, chunk_size, max_new_tokens)
    if not calibrate:
        why = "no time estimate (--no-estimate: no weights loaded)"
        return (Estimate(replay, k=k, why_no_time=why), Estimate(work, max_new_tokens=max_new_tokens, why_no_time=why))
    device = resolve_device(device)
    model = load_model(model_dir, device=device, dtype=resolve_dtype("auto", device))
    profiles = default_profiles(model_dir)
    fallback, _ = recorded_fallback(ReplayOptions(profiles=profiles), model_dir)
    eos = Renderer.from_model_dir(model_dir, vocab_size=model.info.geometry.vocab_size, overrides=template).eos_ids
    settings = Settings(profile=resolve_profile("generation_config", model_dir), max_new_tokens=max_new_tokens, seed=0,
                        eos_ids=eos, chunk_size=chunk_size)
    try:
        rates = calibrate_replay(model, k, profiles + (fallback.renamed(RECORDED),), chunk_size)
        generate_rates = calibrate_generate(model, settings, min(batch_size, max(work.turns, 1)))
    except (NonFiniteOutput, NonFiniteLogits):
        why = "no time estimate (the model's outputs are not finite: replay and generate say what to try)"
        return (Estimate(replay, k=k, why_no_time=why), Estimate(work, max_new_tokens=max_new_tokens, why_no_time=why))
    return (Estimate(replay, rates, k=k), Estimate(work, generate_rates, max_new_tokens=max_new_tokens))


def work_fields(work) -> dict:
    """The work as a dict (JSON of the benchmark)."""
    return {f.name: getattr(work, f.name) for f in fields(work)}
