"""Roster: the drafters one replay runs side by side, and the drafts each makes at every anchor.

Contract: `parse_drafters("mtp,ngram,suffix,hybrid,hybrid_longer")` checks a --drafters list;
`Roster(names, k, ngram, suffix)` holds the model-free drafters of a run and, request by request in
input order, turns a request's tokens (and the MTP head's drafts, when a hybrid needs them) into one
`Drafts` per drafter:

    Drafts.draft_ks  (K'_1, ..)           the draft lengths K' its drafts were made for
    Drafts.tokens    [A, V, K] int32      variant v: the draft made for K' = draft_ks[v] (its first K'
                                          columns; NO_TOKEN after them, and where nothing was proposed)
    Drafts.from_model [A, V] bool | None  where the draft is the model drafter's (None: nowhere)

Two kinds of drafter (docs/drafters.md, "Model-free drafters"):
    prefix-consistent: the draft at K is the first K tokens of the draft at Kmax (mtp, ngram) —
        one variant, K' = Kmax, answers every K, as ACCEPTANCE.md says for the head;
    per-K: the draft at K is chosen by a K-dependent rule (suffix: its match is picked by a score that
        depends on how many tokens K lets each candidate draft; the hybrids: the threshold is K, and the
        suffix draft they weigh is per K) — one variant per K' = 1..Kmax, each exactly what the engine
        drafts with num_speculative_tokens = K'.

The drafters (names as `positions.parquet` `drafter` values):
    mtp            the checkpoint's MTP head (the pipeline drafts it; needs the target's weights)
    ngram          vLLM's prompt lookup (drafters/ngram.py), as its V2 runner (default) or V1 runner proposes it
    suffix         suffix decoding at vLLM's defaults (drafters/suffix.py), drafted per K (by_k)
    hybrid         Arctic Inference's policy (drafters/hybrid.py): suffix decoding's draft where its score
                   reaches K and it proposes anything, else MTP's — with suffix speculating up to its tree
                   depth (SuffixConfig(max_spec_tokens=max_tree_depth), as Arctic configures it), its draft
                   cut to K tokens (rows reach depth Kmax only)
    hybrid_longer  the simplest alternative: the longer of suffix decoding's draft at K and MTP's, suffix on ties
    grammar        the tokens the tool-call grammar forces from the anchor, up to K (grammar.forced_runs; --grammar)
    grammar+mtp    the forced tokens first, then the head's draft from the end of them (grammar.grammar_then)

State that spans requests (suffix decoding's global tree; two trees when both `suffix`/`hybrid_longer` and
`hybrid` run, their speculation budgets differ) is fed every request of the run in input order: `draft`
for the requests this process writes, `add_outputs` for the others. Pure numpy; no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ...errors import OptionError
from . import NO_TOKEN, anchors as anchors_of, span_array
from .hybrid import longer, score_threshold
from .ngram import NgramConfig, NgramDrafter
from .suffix import SuffixConfig, SuffixDecoding

MTP = "mtp"
GRAMMAR = ("grammar", "grammar+mtp")  # need --grammar tools (drafting/grammar.py)
DRAFTERS = (MTP, "ngram", "suffix", "hybrid", "hybrid_longer") + GRAMMAR
MODEL_FREE = ("ngram", "suffix")  # draft from the tokens alone
NEEDS_MTP = (MTP, "hybrid", "hybrid_longer", "grammar+mtp")  # need the head's drafts, so the target's weights
PER_K = ("suffix", "hybrid", "hybrid_longer")  # a draft per K' (module docstring)
STATEFUL = ("suffix", "hybrid", "hybrid_longer")  # state spans requests: fed every request in input order


def parse_drafters(text: str) -> tuple[str, ...]:
    """'mtp,ngram' -> ('mtp', 'ngram'), in the order given; unknown or repeated names refused in one line."""
    names = tuple(n.strip() for n in str(text).split(","))
    if not names or any(not n for n in names):
        raise OptionError(f"--drafters {text!r}: expected a comma-separated list of {', '.join(DRAFTERS)}")
    unknown = [n for n in names if n not in DRAFTERS]
    if unknown:
        raise OptionError(f"--drafters {text}: unknown drafter {unknown[0]!r}; expected some of {', '.join(DRAFTERS)}")
    if len(set(names)) != len(names):
        raise OptionError(f"--drafters {text}: a drafter is named twice; name each once")
    return names


def draft_ks(name: str, k: int) -> tuple[int, ...]:
    """The draft lengths K' a drafter's rows are written for: 1..k for per-K drafters, (k,) otherwise."""
    return tuple(range(1, k + 1)) if name in PER_K else (k,)


@dataclass(frozen=True)
class Drafts:
    name: str
    draft_ks: tuple[int, ...]  # [V] the K' of each variant
    tokens: np.ndarray  # [A, V, K] int32 variant v drafted for draft_ks[v]: columns past it NO_TOKEN
    from_model: np.ndarray | None  # [A, V] bool the draft is the model drafter's (None: nowhere)
    runner: str = "v2"  # the vLLM model runner that serves the drafter (Roster.runner)
    allowed: np.ndarray | None = None  # [A, V, K] bool d_k allowed by the grammar (--grammar; None: no grammar)
    grammar: object = None  # grammar.RequestGrammar of the request (--grammar; the same for every drafter)


def _per_k(draft: np.ndarray) -> np.ndarray:
    """[A, K] one draft -> [A, K, K]: at K' (index K'-1) its first K' tokens, NO_TOKEN after."""
    A, K = draft.shape
    cut = np.arange(K)[None, :] < np.arange(1, K + 1)[:, None]  # [K', K]
    return np.where(cut[None], draft[:, None, :], NO_TOKEN).astype(np.int32)


class Roster:
    """The model-free drafters of one run (configuration and cross-request state) and how each drafter's
    drafts are formed from them and from the MTP head's."""

    def __init__(self, names: tuple[str, ...], k: int, ngram: NgramConfig | None = None,
                 suffix: SuffixConfig | None = None, grammar: str | None = None):
        assert names and all(n in DRAFTERS for n in names) and len(set(names)) == len(names), names
        self.names, self.k = tuple(names), k
        if set(GRAMMAR) & set(names) and grammar is None:
            raise OptionError("--drafters grammar and grammar+mtp draft what a tool-call grammar forces: add --grammar tools")
        from ..grammar import GrammarContext

        self.grammar = GrammarContext(grammar) if grammar is not None else None
        self.ngram_config = ngram or NgramConfig()
        self.suffix_config = suffix or SuffixConfig()
        self._ngram = NgramDrafter(self.ngram_config) if "ngram" in names else None
        # suffix at vLLM's num_speculative_tokens = K' (by_k): the `suffix` rows, and hybrid_longer's suffix side
        self._suffix = SuffixDecoding(self.suffix_config) if {"suffix", "hybrid_longer"} & set(names) else None
        # Arctic's hybrid lets suffix speculate up to its tree depth and weighs the score against K
        self._suffix_deep = SuffixDecoding(self.hybrid_suffix_config) if "hybrid" in names else None
        self._seconds: dict[str, float] = {}  # CPU time drafting, per model-free part (ngram, suffix, suffix_hybrid)
        self._anchors = 0

    def timing(self) -> dict:
        """{part: {"seconds", "anchors"}}: this process's time proposing (add_outputs not counted) and the anchors
        it proposed at — the model-free drafters' cost on this CPU (run.json timing.drafting)."""
        return {part: {"seconds": round(t, 3), "anchors": self._anchors} for part, t in self._seconds.items()}

    def _timed(self, part: str, fn, *args, **kwargs):
        import time

        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        self._seconds[part] = self._seconds.get(part, 0.0) + time.perf_counter() - t0
        return out

    @property
    def hybrid_suffix_config(self) -> SuffixConfig:
        return SuffixConfig(**{**asdict(self.suffix_config), "max_spec_tokens": self.suffix_config.max_tree_depth})

    @property
    def needs_model(self) -> bool:
        return any(n in NEEDS_MTP for n in self.names)

    @property
    def stateful(self) -> bool:
        return any(n in STATEFUL for n in self.names)

    def manifest(self) -> dict:
        """run.json `drafters`: {name: its parameters and "draft_k", the K' its rows are written for}."""
        suffix = {key: value for key, value in asdict(self.suffix_config).items() if key != "max_spec_tokens"}
        about = {
            MTP: {},
            "ngram": {"prompt_lookup_min": self.ngram_config.prompt_lookup_min,
                      "prompt_lookup_max": self.ngram_config.prompt_lookup_max,
                      "max_model_len": self.ngram_config.max_model_len, "runner": self.ngram_config.runner},
            "suffix": suffix,
            "hybrid": {"policy": "suffix when its score >= K and it drafts, else mtp (Arctic Inference)",
                       "suffix": {**suffix, "max_spec_tokens": self.suffix_config.max_tree_depth}},
            "hybrid_longer": {"policy": "the longer of suffix's draft at K and mtp's, suffix on ties", "suffix": suffix},
            "grammar": {"policy": "the tokens the tool-call grammar forces from the anchor, up to K"},
            "grammar+mtp": {"policy": "the forced tokens, then mtp's draft from the end of them"},
        }
        return {n: {**about[n], "runner": self.runner(n), "draft_k": list(draft_ks(n, self.k))} for n in self.names}

    def runner(self, name: str) -> str:
        """The vLLM model runner that serves the drafter, whose rules its rows follow: "v2" for mtp (vLLM 0.33's
        default on CUDA, vllm/config/vllm.py:730-767) and n-gram as configured (--ngram-runner); "v1" for suffix
        decoding (V2 does not support it: `_get_v2_model_runner_unsupported_features`, vllm/config/vllm.py:3053-3087)
        and the hybrids (Arctic Inference patches the V1 runner). The runner decides n-gram's rule and whether the
        rejection sampler applies min-p at draft positions (target.py)."""
        if name == "ngram":
            return self.ngram_config.runner
        return "v2" if name == MTP else "v1"

    def draft(self, tokens: np.ndarray, spans, keep: int | None = None, mtp: np.ndarray | None = None) -> list[Drafts]:
        """One Drafts per drafter of the roster, in its order, at every anchor of one request.

        tokens [n]; spans [S, 2] or rendering.Spans; keep: the prefix the next request shares (a hint);
        mtp: [A, K] int the head's drafts at the same anchors (required when a drafter needs them)."""
        K = self.k
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        sp = span_array(spans)
        A = len(anchors_of(sp))
        if self.needs_model:
            assert mtp is not None and mtp.shape == (A, K), "the hybrids and mtp need the head's [A, K] drafts"
            mtp = np.asarray(mtp, dtype=np.int32)
        self._anchors += A
        if self._suffix is not None:
            by_k = self._timed("suffix", self._suffix.propose, tokens, sp, K, by_k=True, keep=keep)
            by_k_tokens = by_k.tokens_by_k if by_k.tokens_by_k is not None else by_k.tokens[:, None, :]  # K = 1
        if self._suffix_deep is not None:
            deep = self._timed("suffix_hybrid", self._suffix_deep.propose, tokens, sp, K, keep=keep)
            deep_by_k = _per_k(deep.tokens)
        out = []
        for name in self.names:
            runner = self.runner(name)
            if name == MTP:
                out.append(Drafts(name, (K,), mtp[:, None, :], np.ones((A, 1), dtype=bool), runner))
            elif name == "ngram":
                got = self._timed("ngram", self._ngram.propose, tokens, sp, K, keep=keep)
                out.append(Drafts(name, (K,), got.tokens[:, None, :], None, runner))
            elif name in GRAMMAR:
                out.append(Drafts(name, (K,), np.full((A, 1, K), NO_TOKEN, dtype=np.int32), None, runner))
            elif name == "suffix":
                out.append(Drafts(name, draft_ks(name, K), by_k_tokens, None, runner))
            else:
                model = _per_k(mtp)  # [A, K', K]
                variants, chosen = [], []
                for v in range(K):  # K' = v + 1
                    if name == "hybrid":
                        c = score_threshold(deep_by_k[:, v], deep.scores, model[:, v], threshold=v + 1)
                    else:
                        c = longer(by_k_tokens[:, v], model[:, v])
                    variants.append(c.tokens)
                    chosen.append(~c.primary)
                out.append(Drafts(name, draft_ks(name, K), np.stack(variants, axis=1).astype(np.int32),
                                  np.stack(chosen, axis=1), runner))
        return self._with_grammar(out, tokens, spans, sp, mtp) if self.grammar is not None else out

    def _with_grammar(self, out: list[Drafts], tokens, spans, sp, mtp) -> list[Drafts]:
        """--grammar: the request through the tool-call grammar; the grammar drafters' drafts from its forced tokens,
        every draft's verdict (allowed given the recorded prefix and the drafts before it)."""
        from ..grammar import forced_runs, grammar_then
        from . import span_ends

        at, ends = anchors_of(sp), span_ends(sp)
        others = [(i, v) for i, d in enumerate(out) if d.name not in GRAMMAR for v in range(len(d.draft_ks))]
        g = self._timed("grammar", self.grammar.run, tokens, spans, at, [out[i].tokens[:, v, :] for i, v in others])
        verdicts = {key: g.draft_allowed[j] for j, key in enumerate(others)}
        forced = forced_runs(g.forced_token, at, ends, self.k)
        mtp_allowed = verdicts.get((self.names.index(MTP), 0)) if MTP in self.names else None
        done = []
        for i, d in enumerate(out):
            if d.name == "grammar":
                d = Drafts(d.name, d.draft_ks, forced[:, None, :], None, d.runner)
                allowed = np.ones(forced.shape, dtype=bool)[:, None, :]  # forced tokens are the recorded ones
            elif d.name == "grammar+mtp":
                draft, shift = grammar_then(forced, mtp, at)
                d = Drafts(d.name, d.draft_ks, draft[:, None, :], (shift == 0)[:, None], d.runner)
                allowed = np.ones(draft.shape, dtype=bool)
                if mtp_allowed is not None:  # the head's part: its verdict at anchor p + f (the same chain)
                    src = np.minimum(np.arange(len(at)) + shift, max(len(at) - 1, 0))
                    k = np.arange(self.k)[None, :] - shift[:, None]
                    moved = mtp_allowed[src[:, None], np.clip(k, 0, self.k - 1)] if len(at) else allowed
                    allowed = np.where(k >= 0, moved, True) & (draft >= 0) | (draft < 0)
                allowed = allowed[:, None, :]
            else:
                allowed = np.stack([verdicts[(i, v)] for v in range(len(d.draft_ks))], axis=1)
            done.append(Drafts(d.name, d.draft_ks, d.tokens, d.from_model, d.runner, allowed, g))
        return done

    def add_outputs(self, tokens: np.ndarray, spans) -> None:
        """A request whose rows another process writes (or a resumed run already has): state only."""
        for drafter in (self._suffix, self._suffix_deep):
            if drafter is not None:
                drafter.add_outputs(tokens, spans)
