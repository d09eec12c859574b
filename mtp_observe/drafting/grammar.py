"""Grammar: a recorded tool call run token by token through the grammar an engine decodes it under (docs/grammar.md).

Contract: `ToolGrammar(tokenizer_info)` compiles, per set of tools, the grammar of the chat format's tool calls with
each tool's arguments constrained by its `parameters` schema (xgrammar, the library vLLM and SGLang use by default);
`scan(tokens, start, end, drafts)` runs one turn's tool-call region x_start..x_end (x_end its end-of-turn token)
through a GrammarMatcher over the recorded ids and says, for every position i of the region:

    Scan.allowed       [L] int32   the allowed-set size for x_{start+i} given x_start..x_{start+i-1} (L = end-start+1)
    Scan.forced_token  [L] int32   the one allowed token where the set has size 1 (forced), else -1
    Scan.masks         [L, W] int32 the packed allowed set (xgrammar's bitmask row, W = ceil(V/32)) for x_{start+i}
    Scan.violation     int | None  the first position whose recorded token the grammar refuses (the call breaks
                                   its schema or the format): the turn is then scored without the mask
    Scan.draft_allowed [G] of [A_g, K] bool  for each drafter's drafts (anchor p, depth k): d_k is allowed given
                                   x_0..x_p and d_1..d_{k-1} (True where the grammar does not reach: before the
                                   region, or after a violation)

Formats (the family's rendering of a call, detected from the rendered region; xgrammar's builtin structural tags,
xgrammar/builtin_structural_tag.py, tool_choice "auto" over the request's tools — free text until the trigger, as text may precede a call — no reasoning prefix — the
region starts after the reasoning and text):
    qwen_3_5   <tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>
               (Qwen3.5, Qwen3-Coder; the bundled model's template), arguments in xgrammar's "qwen_xml" style
    qwen_3     <tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call> (Qwen3, Hermes), arguments JSON
Worked example (byte-level vocabulary, one tool `f` whose parameters require {"a": integer}, qwen_3 form): after
'<tool_call>\\n{"name": "' the bytes 'f", "arguments": {"a": ' are forced one by one (one tool, one required key,
the separators fixed by xgrammar's JSON style), then a digit is free (allowed set = the digits and '-').

Nothing here imports torch's model stack; xgrammar is imported on first use (the optional extra
`mtp-observe[grammar]`; `require()` says so in one line).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ..errors import OptionError

EXTRA = "mtp-observe[grammar]"
MODES = ("tools",)
FORMATS = ("qwen_3_5", "qwen_3")


def require():
    """The xgrammar module, or one line naming the extra that brings it."""
    try:
        import xgrammar
    except ImportError:
        raise OptionError(f"--grammar tools needs xgrammar, which is not installed: pip install '{EXTRA}'") from None
    return xgrammar


def parse_grammar(text: str | None) -> str | None:
    """--grammar's value: None (off) or 'tools'; anything else refused in one line."""
    if text is None:
        return None
    if text not in MODES:
        raise OptionError(f"--grammar {text!r}: expected one of {', '.join(MODES)}")
    return text


def detect_format(region_text: str) -> str | None:
    """The tool-call format a rendered region is written in (None: none this module models)."""
    if "<function=" in region_text:
        return "qwen_3_5"
    if '<tool_call>\n{"name"' in region_text:
        return "qwen_3"
    return None


def tokenizer_info(tokenizer, vocab_size: int, stop_ids) -> object:
    """xgrammar's TokenizerInfo of a transformers tokenizer (the target's), stop_ids the end-of-turn tokens."""
    xgr = require()
    return xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(set(stop_ids)))


def _function_tools(tools) -> list[dict]:
    """The request's tools as OpenAI function tools with an object `parameters` schema (others left out)."""
    out = []
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters")
        params = params if isinstance(params, dict) and params else {"type": "object"}
        out.append({"type": "function", "function": {"name": fn["name"], "parameters": params}})
    return out


@dataclass(frozen=True)
class Scan:
    start: int
    end: int
    allowed: np.ndarray  # [L] int32
    forced_token: np.ndarray  # [L] int32, -1 where not forced
    masks: np.ndarray  # [L, W] int32 packed allowed sets
    violation: int | None
    draft_allowed: list  # [G] of [A_g, K] bool


class ToolGrammar:
    """Compiled tool-call grammars of one tokenizer, cached by (format, tools)."""

    def __init__(self, info):
        xgr = require()
        self.xgr, self.info = xgr, info
        self.vocab = int(info.vocab_size)
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._cache: dict = {}
        self.compile_seconds = 0.0
        self.scan_seconds = 0.0

    def compiled(self, tools, fmt: str):
        """The compiled grammar of tool calls to `tools` in format `fmt`; None when no tool has a usable schema
        or xgrammar refuses the schema (counted by the caller as a region without a grammar)."""
        import time

        fns = _function_tools(tools)
        key = (fmt, json.dumps(fns, sort_keys=True, default=str))
        if key not in self._cache:
            t0 = time.perf_counter()
            try:
                tag = self.xgr.get_model_structural_tag(fmt, tools=fns, tool_choice="auto", reasoning="disabled")
                self._cache[key] = self.compiler.compile_structural_tag(tag) if fns else None
            except Exception:  # an unsupported or invalid schema: xgrammar raises several types
                self._cache[key] = None
            self.compile_seconds += time.perf_counter() - t0
        return self._cache[key]

    def scan(self, compiled, tokens: np.ndarray, start: int, end: int, drafts=(), anchors=None) -> Scan:
        """Run x_start..x_end through the grammar; drafts: [G] of [A, K] int (NO_TOKEN -1 where none) at `anchors`
        [A] int64 (any anchors of the request: those whose drafts land in the region are checked)."""
        import time

        t0 = time.perf_counter()
        try:
            return _scan(self.xgr, compiled, self.vocab, np.asarray(tokens), start, end, list(drafts), anchors)
        finally:
            self.scan_seconds += time.perf_counter() - t0


def _bits(mask: np.ndarray, ids: np.ndarray, vocab: int) -> np.ndarray:
    """[n] bool: ids allowed by a packed int32 bitmask row (ids outside the vocabulary: not allowed)."""
    ids = np.asarray(ids, dtype=np.int64)
    ok = (ids >= 0) & (ids < vocab)
    safe = np.where(ok, ids, 0)
    return ok & (((mask[safe >> 5].view(np.uint32) >> (safe & 31).astype(np.uint32)) & 1) == 1)


def _count(mask: np.ndarray, vocab: int) -> tuple[int, int]:
    """(allowed-set size, the one allowed token or -1) of a packed bitmask row."""
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:vocab]
    n = int(bits.sum())
    return n, (int(np.flatnonzero(bits)[0]) if n == 1 else -1)


def _scan(xgr, compiled, vocab: int, tokens: np.ndarray, start: int, end: int, drafts: list, anchors) -> Scan:
    L = end - start + 1
    allowed = np.zeros(L, dtype=np.int32)
    forced = np.full(L, -1, dtype=np.int32)
    out = [np.ones(d.shape, dtype=bool) for d in drafts]
    K = max((d.shape[1] for d in drafts), default=0)
    matcher = xgr.GrammarMatcher(compiled, max_rollback_tokens=max(K, 1))
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    row = bitmask[0].numpy()
    masks = np.zeros((L, row.shape[0]), dtype=np.int32)
    # the rows whose depth k lands in the region (p + k >= start), by the position they predict
    landing = []  # per drafter: (anchor index [R], depth index [R], predicted position [R])
    for d in drafts:
        a_idx, k_idx = np.nonzero(d >= 0)
        pos = np.asarray(anchors)[a_idx] + k_idx + 1
        keep = (pos >= start) & (pos <= end)
        landing.append((a_idx[keep], k_idx[keep], pos[keep]))
    on_path = [_on_path(d, tokens, np.asarray(anchors)) if len(d) else np.zeros(d.shape, dtype=bool) for d in drafts]
    violation = None
    for i in range(L):
        matcher.fill_next_token_bitmask(bitmask)
        mask = masks[i] = row
        allowed[i], forced[i] = _count(mask, vocab)
        at = start + i
        for g, (a_idx, k_idx, pos) in enumerate(landing):
            sel = pos == at
            if not sel.any():
                continue
            a_s, k_s = a_idx[sel], k_idx[sel]
            # on the recorded path up to depth k-1 (the chain's earlier drafts equal x): the mask at `at` decides
            path = on_path[g][a_s, k_s]
            a_p, k_p = a_s[path], k_s[path]
            ok = _bits(mask, drafts[g][a_p, k_p], vocab)
            out[g][a_p, k_p] = ok
            # the first depth off the path, allowed: the matcher follows the drafts from here (then rolls back)
            for a, k in zip(a_p[ok], k_p[ok]):
                if drafts[g][a, k] != tokens[at] and k + 1 < drafts[g].shape[1]:
                    _follow(matcher, bitmask, row, drafts[g][a], k, out[g][a], vocab)
        if not matcher.accept_token(int(tokens[at])):
            violation = at
            break
    if violation is not None:  # the turn is scored without the mask: nothing forced, every draft allowed
        allowed[:] = 0
        forced[:] = -1
        out = [np.ones(d.shape, dtype=bool) for d in drafts]
    out = [np.cumprod(o, axis=1).astype(bool) for o in out]  # a forbidden draft ends the chain
    return Scan(start, end, allowed, forced, masks, violation, out)


def _on_path(d: np.ndarray, tokens: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """[A, K] bool: d_1..d_{k-1} all equal x_{p+1}..x_{p+k-1} (depth 1 always on the path)."""
    A, K = d.shape
    pos = anchors[:, None] + np.arange(1, K + 1)[None, :]
    actual = tokens[np.minimum(pos, len(tokens) - 1)]
    match = (d == actual) & (pos < len(tokens))
    before = np.concatenate([np.ones((A, 1), dtype=bool), np.cumprod(match, axis=1)[:, :-1].astype(bool)], axis=1)
    return before


def _follow(matcher, bitmask, row, chain: np.ndarray, k: int, out_row: np.ndarray, vocab: int) -> None:
    """Drafts d_{k+1}.. after an allowed d_k that leaves the recorded path: accept d_k.., check each next one."""
    taken = 0
    for j in range(k, len(chain) - 1):
        if chain[j + 1] < 0 or not matcher.accept_token(int(chain[j])):
            break
        taken += 1
        if matcher.is_terminated():  # d_j was a stop token: nothing follows it
            out_row[j + 1:] = False
            break
        matcher.fill_next_token_bitmask(bitmask)
        ok = bool(_bits(row, np.array([chain[j + 1]]), vocab)[0])
        out_row[j + 1] = ok
        if not ok:
            out_row[j + 2:] = False
            break
    if taken:
        matcher.rollback(taken)


TOOL_CALL = 2  # rendering.SEGMENTS' code of a tool-call token


def called_names(messages) -> list[str]:
    """The tool names a session's assistant messages call, first call first (the names-only grammar's tools)."""
    names = []
    for m in messages:
        for call in m.get("tool_calls") or ():
            fn = call.get("function", call) if isinstance(call, dict) else {}
            name = fn.get("name") if isinstance(fn, dict) else None
            if isinstance(name, str) and name not in names:
                names.append(name)
    return names


@dataclass(frozen=True)
class RequestGrammar:
    """One request's grammar pass: per position of the request, and the drafts' verdicts."""

    allowed: np.ndarray  # [n] int32 allowed-set size for x_i (0: no grammar there — outside a tool-call region,
    #                       a turn scored without the mask, or a format not modelled)
    forced_token: np.ndarray  # [n] int32 the one allowed token at i (-1: not forced)
    draft_allowed: list  # [G] of [A, K] bool, the drafts given in order
    regions: int  # tool-call regions scanned
    violations: tuple  # (turn, position) of each region whose recorded call the grammar refuses
    mask_positions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # [M] ascending: the positions i whose x_i the grammar
    #                       constrained (the regions of calls that keep their schema)
    masks: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int32))  # [M, W] the packed allowed set for x_i at each of them  # (turn, position) of each region whose recorded call the grammar refuses

    @property
    def forced(self) -> np.ndarray:
        """[n] bool: x_i was the one token the grammar allowed."""
        return self.forced_token >= 0


class GrammarContext:
    """`--grammar tools` in a replay: the target's tokenizer's grammars, the session being drafted and the run's tally
    (run.json `grammar`)."""

    def __init__(self, mode: str):
        require()
        self.mode = mode
        self.tool_grammar = None
        self.tokenizer = None
        self.tools: list = []
        self.names_only = False
        self.session_id = ""
        self.tally = {"regions": 0, "regions_names_only": 0, "regions_unmodelled": 0, "regions_without_grammar": 0,
                      "violations": 0, "tool_call_tokens": 0, "forced_tokens": 0}
        self.flagged: list[dict] = []  # {"session_id", "request", "turn", "position"} of each violation (first 100)
        self.formats: dict[str, int] = {}
        self.request = 0  # the request's index within the session (flagged calls name it)

    def begin_session(self, session, tokenizer, vocab_size: int, stop_ids) -> None:
        """The session whose requests are drafted next (its tools; a names-only grammar where it carries none)."""
        if self.tool_grammar is None:
            self.tokenizer = tokenizer
            self.tool_grammar = ToolGrammar(tokenizer_info(tokenizer, vocab_size, stop_ids))
        self.session_id = session.id
        tools = _function_tools(session.tools)
        self.names_only = not tools
        self.tools = tools or [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
                               for n in called_names(session.messages)]
        self.request = 0

    def manifest(self) -> dict:
        """run.json `grammar`."""
        tg = self.tool_grammar
        return {"mode": self.mode, "formats": dict(self.formats), **self.tally, "flagged": self.flagged[:100],
                "seconds": {"compile": round(tg.compile_seconds, 3) if tg else 0.0,
                            "scan": round(tg.scan_seconds, 3) if tg else 0.0}}

    def run(self, tokens: np.ndarray, spans, anchors: np.ndarray, drafts=()) -> RequestGrammar:
        """The grammar over every tool-call region of one request; drafts: [G] of [A, K] at `anchors`."""
        n = len(tokens)
        allowed = np.zeros(n, dtype=np.int32)
        forced = np.full(n, -1, dtype=np.int32)
        verdicts = [np.ones(d.shape, dtype=bool) for d in drafts]
        regions, violations, mask_positions, masks = 0, [], [], []
        for sp in spans if self.tool_grammar is not None else ():  # no session begun (an estimate's calibration): none
            codes = np.frombuffer(sp.segments, dtype=np.int8)
            where = np.flatnonzero(codes == TOOL_CALL)
            if not len(where):
                continue
            start = _region_start(self.tokenizer, tokens, sp.start + int(where[0]), sp.start)
            regions += 1
            self.tally["regions"] += 1
            self.tally["tool_call_tokens"] += sp.end - start
            fmt = detect_format(self.tokenizer.decode(tokens[start:sp.end].tolist()))
            compiled = self.tool_grammar.compiled(self.tools, fmt) if fmt is not None and self.tools else None
            if fmt is None:
                self.tally["regions_unmodelled"] += 1
                continue
            self.formats[fmt] = self.formats.get(fmt, 0) + 1
            if compiled is None:
                self.tally["regions_without_grammar"] += 1
                continue
            self.tally["regions_names_only"] += int(self.names_only)
            scan = self.tool_grammar.scan(compiled, tokens, start, sp.end, drafts, anchors)
            if scan.violation is not None:
                violations.append((sp.turn, scan.violation))
                self.tally["violations"] += 1
                if len(self.flagged) < 100:
                    self.flagged.append({"session_id": self.session_id, "request": self.request, "turn": sp.turn,
                                         "position": scan.violation})
                continue
            allowed[start:sp.end + 1] = scan.allowed
            forced[start:sp.end + 1] = scan.forced_token
            mask_positions.append(np.arange(start, sp.end + 1, dtype=np.int64))
            masks.append(scan.masks)
            self.tally["forced_tokens"] += int((scan.forced_token[:-1] >= 0).sum())
            verdicts = [v & s for v, s in zip(verdicts, scan.draft_allowed)]
        self.request += 1
        if not masks:
            return RequestGrammar(allowed, forced, verdicts, regions, tuple(violations))
        return RequestGrammar(allowed, forced, verdicts, regions, tuple(violations), np.concatenate(mask_positions),
                              np.concatenate(masks))


def _region_start(tokenizer, tokens: np.ndarray, first: int, span_start: int) -> int:
    """The region's first token: the first tool-call token, or the one before it when that one holds the opening
    "<tool_call>" (rendering labels a token by its first character, and a template whose message without calls ends
    in "<|im_end|>" shares the "<" with "<tool_call>", so the call's rendering is found one character late)."""
    if first > span_start and "<tool_call>" not in tokenizer.decode([int(tokens[first])]) \
            and "<tool_call>" in tokenizer.decode([int(tokens[first - 1])]):
        return first - 1
    return first


def forced_runs(forced_token: np.ndarray, anchors: np.ndarray, ends: np.ndarray, k: int) -> np.ndarray:
    """[A, K] int32: the `grammar` drafter — at anchor p the forced tokens x_{p+1}, x_{p+2}, .. while each is forced,
    up to K and the end of the turn; -1 after (nothing where x_{p+1} is not forced). Worked example: forced_token
    [-1, 7, 8, -1, 9], anchor 0, end 4, K 3 -> [7, 8, -1]; anchor 3 -> [9, -1, -1]."""
    A = len(anchors)
    pos = anchors[:, None] + np.arange(1, k + 1)[None, :]
    inside = pos <= ends[:, None]
    tok = np.where(inside, forced_token[np.minimum(pos, len(forced_token) - 1)], -1)
    run = np.cumprod(tok >= 0, axis=1).astype(bool)
    return np.where(run, tok, -1).astype(np.int32).reshape(A, k)


def grammar_then(forced: np.ndarray, mtp: np.ndarray, anchors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The `grammar+mtp` drafter: at anchor index a, its f forced tokens then the head's draft at anchor a + f (its
    context is x_0..x_{p+f}, the forced tokens being the recorded ones) cut to K - f; anchors are consecutive within
    a span, so a + f is anchor p + f whenever p + f < e (else the forced run reaches the end: nothing follows).
    forced, mtp: [A, K], anchors [A] -> (draft [A, K] int32, shift [A] int64 = f). Worked example, K 3: forced [7, -1, -1] at
    anchor index 0 and the head's draft [5, 6, 4] at anchor index 1 -> [7, 5, 6]."""
    A, K = forced.shape
    f = (forced >= 0).sum(axis=1)
    out = forced.copy()
    for a in np.flatnonzero((f > 0) & (f < K)):
        j = a + f[a]
        if j < A and anchors[j] == anchors[a] + f[a]:
            out[a, f[a]:] = mtp[j, : K - f[a]]
    at0 = f == 0
    out[at0] = mtp[at0]
    return out.astype(np.int32), f.astype(np.int64)
