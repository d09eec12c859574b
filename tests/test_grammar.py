"""replay --grammar tools: tool calls run through their grammar (mtp_observe/drafting/grammar.py, docs/grammar.md).

A byte-level vocabulary (one token per byte, a stop token 256) makes the forced tokens readable by hand. The
draft verdicts are checked against an independent draft-and-verify loop that builds a fresh xgrammar matcher for
every anchor and applies the same bitmask the way vLLM's scheduler does (a draft the grammar refuses ends the
chain); the engine's own loop is not run here (the bundled model is not needed to decide a mask)."""

from __future__ import annotations

import sys

import numpy as np

from mtp_observe.drafting.grammar import RequestGrammar, forced_runs, grammar_then
from tests.fuzzing import run_cli

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]
STOP = 256
JSON_CALL = '<tool_call>\n{"name": "f", "arguments": {"a": 12}}\n</tool_call>'
XML_CALL = "<tool_call>\n<function=f>\n<parameter=a>\n12\n</parameter>\n</function>\n</tool_call>"


def _grammar():
    import xgrammar as xgr  # the [test] extra installs it: never skipped

    from mtp_observe.drafting.grammar import ToolGrammar

    info = xgr.TokenizerInfo([bytes([i]) for i in range(256)] + [b"</s>"], vocab_type=xgr.VocabType.RAW,
                             stop_token_ids=[STOP])
    return xgr, ToolGrammar(info)


def _tokens(text: str) -> np.ndarray:
    return np.array(list(text.encode()) + [STOP], dtype=np.int64)


def _forced_text(text: str, scan) -> str:
    return "".join(chr(t) if f >= 0 else "_" for t, f in zip(_tokens(text)[:-1], scan.forced_token[:-1]))


def test_the_json_form_forces_the_name_the_separators_and_the_required_key():
    _, tg = _grammar()
    scan = tg.scan(tg.compiled(TOOLS, "qwen_3"), _tokens(JSON_CALL), 0, len(JSON_CALL))
    assert scan.violation is None
    # free text until the trigger "<tool_call>"; then one tool, one required key: every byte but whitespace choices
    # and the number is forced (the second "}" and the closing tag too)
    assert _forced_text(JSON_CALL, scan) == '___________\n{"name": "f", "arguments": {_a"_____}\n</tool_call>'
    assert scan.allowed[0] == 257 and scan.allowed[-1] == 257  # free text: every byte and the stop token
    assert scan.allowed[JSON_CALL.index('{"a"') + 1] == 5  # '"' or JSON whitespace before the key
    assert (scan.allowed[scan.forced_token >= 0] == 1).all()


def test_the_qwen_xml_form_forces_the_name_and_the_parameter_tags():
    _, tg = _grammar()
    scan = tg.scan(tg.compiled(TOOLS, "qwen_3_5"), _tokens(XML_CALL), 0, len(XML_CALL))
    assert scan.violation is None
    assert _forced_text(XML_CALL, scan) == ("______________________f>\n_parameter=a>_____/parameter>__/function>\n"
                                            "</tool_call>")


def test_a_call_that_breaks_its_schema_is_a_violation_and_scored_without_the_mask():
    _, tg = _grammar()
    bad = JSON_CALL.replace("12", '"x"')
    scan = tg.scan(tg.compiled(TOOLS, "qwen_3"), _tokens(bad), 0, len(bad))
    assert scan.violation == bad.index('"x"')  # a string where the schema says integer
    assert (scan.allowed == 0).all() and (scan.forced_token == -1).all()


def _loop_verdicts(xgr, compiled, tokens, start, anchors, drafts):
    """The engine's rule, independently: at anchor p a fresh matcher takes x_start..x_p, then each draft d_k is
    checked against the bitmask and, when allowed, accepted before d_{k+1} is checked; the first refused draft ends
    the chain (vLLM's scheduler truncates the draft there). Depths landing before the region: allowed."""
    out = np.ones(drafts.shape, dtype=bool)
    bitmask = xgr.allocate_token_bitmask(1, 257)
    for a, p in enumerate(anchors):
        m = xgr.GrammarMatcher(compiled)
        for t in tokens[start : p + 1]:
            assert m.accept_token(int(t))
        for k in range(drafts.shape[1]):
            if p + k + 1 < start:
                continue
            m.fill_next_token_bitmask(bitmask)
            d = int(drafts[a, k])
            allowed = bool((int(bitmask[0, d // 32]) >> (d % 32)) & 1)
            if not allowed or not m.accept_token(d):
                out[a, k:] = False
                break
            if m.is_terminated():  # a stop token: nothing follows it
                out[a, k + 1:] = False
                break
    return out


def test_draft_verdicts_equal_a_verify_loop_that_applies_the_same_bitmask():
    xgr, tg = _grammar()
    compiled = tg.compiled(TOOLS, "qwen_3")
    text = "ok " + JSON_CALL
    tokens, start = _tokens(text), 3
    end = len(tokens) - 1
    anchors = np.arange(start - 1, end)
    rng = np.random.default_rng(0)
    K = 3
    recorded = np.stack([tokens[np.minimum(anchors + k, end)] for k in range(1, K + 1)], axis=1)
    # drafts: the recorded continuation, with random bytes swapped in (some allowed off the path, some refused)
    drafts = np.where(rng.random(recorded.shape) < 0.3, rng.choice(np.frombuffer(b' "a1}x{:', np.uint8),
                                                                    recorded.shape), recorded)
    # and by hand, after '{' of the arguments: a space (off the recorded path, allowed), then '"', 'a' (allowed);
    # a space, then 'x' (refused: ends the chain)
    brace = text.index('{"a"')
    anchors = np.concatenate([anchors, [brace, brace]])
    drafts = np.concatenate([drafts, [list(b' "a'), list(b' x"')]])
    recorded = np.concatenate([recorded, recorded[[brace - start + 1] * 2]])
    scan = tg.scan(compiled, tokens, start, end, [drafts], anchors)
    expected = _loop_verdicts(xgr, compiled, tokens, start, anchors, drafts)
    assert scan.draft_allowed[0][-2:].tolist() == [[True, True, True], [True, False, False]]
    rows = anchors[:, None] + np.arange(1, K + 1)[None, :] <= end  # the evaluable (anchor, depth) rows
    assert (scan.draft_allowed[0] == expected)[rows].all()
    assert (~expected[:-2, 0]).any()  # the random drafts hold refused ones too
    # greedy acceptance under the mask (the chain while d_k == x and d_k allowed) equals acceptance without it:
    # a recorded token is always allowed in a call that keeps its schema
    match = np.cumprod(drafts == recorded, axis=1).astype(bool)
    assert (match & expected == match)[rows].all()


def test_the_grammar_drafter_is_the_forced_run_and_the_hybrid_continues_with_the_head():
    forced_token = np.array([-1, 7, 8, -1, 9], dtype=np.int32)
    anchors, ends = np.array([0, 1, 2, 3]), np.array([4, 4, 4, 4])
    runs = forced_runs(forced_token, anchors, ends, 3)
    assert runs.tolist() == [[7, 8, -1], [8, -1, -1], [-1, -1, -1], [9, -1, -1]]
    mtp = np.array([[5, 6, 4], [1, 2, 3], [4, 5, 6], [9, 1, 1]], dtype=np.int32)
    draft, shift = grammar_then(runs, mtp, anchors)
    # anchor 0: 7, 8 forced, then the head's draft at anchor 2; anchor 2: nothing forced, the head's own
    assert draft.tolist() == [[7, 8, 4], [8, 4, 5], [4, 5, 6], [9, -1, -1]]
    assert shift.tolist() == [2, 1, 0, 1]


def test_a_schema_breaking_call_is_flagged_per_turn(tmp_path):
    xgr, tg = _grammar()
    from mtp_observe.drafting.grammar import GrammarContext
    from mtp_observe.sessions.rendering import Span

    class ByteTokenizer:
        def decode(self, ids):
            return bytes(i for i in ids if i < 256).decode("latin-1")

    class Session:
        id, tools, messages = "s", TOOLS, []

    ctx = GrammarContext("tools")
    ctx.tool_grammar, ctx.tokenizer = tg, ByteTokenizer()
    ctx.begin_session(Session(), ctx.tokenizer, 257, [STOP])
    good, bad = "x" + JSON_CALL, "x" + JSON_CALL.replace("12", '"x"')
    tokens = np.concatenate([_tokens(good), _tokens(bad)])
    spans = [Span(0, len(good), 1, bytes([1] + [2] * (len(good) - 1) + [3])),
             Span(len(good) + 1, len(tokens) - 1, 3, bytes([1] + [2] * (len(bad) - 1) + [3]))]
    got = ctx.run(tokens, spans, np.zeros(0, dtype=np.int64))
    assert isinstance(got, RequestGrammar) and got.regions == 2
    assert [turn for turn, _ in got.violations] == [3]
    assert got.forced[: len(good)].any() and not got.forced[len(good) + 1:].any()
    tally = ctx.manifest()
    assert tally["violations"] == 1 and tally["flagged"] == [{"session_id": "s", "request": 0, "turn": 3,
                                                              "position": len(good) + 1 + bad.index('"x"')}]


def test_grammar_without_the_extra_is_one_line_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar raises ImportError
    code, out, err = run_cli(["replay", "sessions/demo.jsonl", "--grammar", "tools", "--dry-run"])
    assert code == 2
    assert err.strip().count("\n") == 0 and "pip install 'mtp-observe[grammar]'" in err


def test_grammar_drafters_without_grammar_are_refused_in_one_line():
    code, out, err = run_cli(["replay", "sessions/demo.jsonl", "--drafters", "mtp,grammar", "--dry-run"])
    assert code == 2 and err.strip().count("\n") == 0 and "--grammar tools" in err


def test_a_model_free_replay_with_the_grammar_flags_a_call_to_an_unknown_tool_and_reports_the_forced_share(tmp_path):
    import json

    import pyarrow.parquet as pq
    import xgrammar  # noqa: F401  (the [test] extra installs it: never skipped)

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    good = json.loads((root / "sessions" / "coding.jsonl").read_text().splitlines()[0])
    bad = json.loads(json.dumps(good))
    bad["id"] = "broken"
    calls = [m for m in bad["messages"] if m.get("tool_calls")]
    calls[0]["tool_calls"][0]["function"]["name"] = "delete_repository"  # no such tool: the grammar refuses it
    sessions = tmp_path / "s.jsonl"
    sessions.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    out = tmp_path / "run"
    code, _, err = run_cli(["replay", str(sessions), "--drafters", "ngram,grammar", "--grammar", "tools",
                            "--out", str(out), "--progress-every", "0"])
    assert code == 0, err
    manifest = json.loads((out / "run.json").read_text())
    tally = manifest["grammar_tally"]
    assert manifest["grammar"] == "tools" and manifest["schema_version"] == 6
    assert tally["violations"] == 1 and [f["session_id"] for f in tally["flagged"]] == ["broken"]
    turn = bad["messages"].index(calls[0])
    assert tally["flagged"][0]["turn"] == turn
    t = pq.read_table(out / "positions.parquet").to_pandas()
    first = t[(t.depth == 1) & (t.drafter == "ngram")]
    assert first.forced.sum() == tally["forced_tokens"] > 0
    assert set(first[first.forced].segment.astype(str)) <= {"tool_call", "end"}
    # the broken turn is scored without the mask: nothing forced in it, nothing drafted by `grammar` there
    assert not t[(t.session_id == "broken") & (t.turn == turn)].forced.any()
    code, report, _ = run_cli(["report", str(out)])
    line = next(x for x in report.splitlines() if x.startswith("grammar (what-if"))
    assert f"of {tally['tool_call_tokens']:,} tool-call tokens forced" in line and "1 call(s) break their schema" in line


def test_tallies_of_ranks_or_shards_add_up():
    from mtp_observe.run.manifest import summed_grammar

    a = {"mode": "tools", "regions": 2, "violations": 1, "formats": {"qwen_3_5": 2}, "flagged": [{"turn": 1}],
         "seconds": {"compile": 0.5, "scan": 1.0}}
    b = {"mode": "tools", "regions": 3, "violations": 0, "formats": {"qwen_3": 3}, "flagged": [],
         "seconds": {"compile": 0.25, "scan": 0.5}}
    assert summed_grammar([a, b]) == {"mode": "tools", "regions": 5, "violations": 1,
                                      "formats": {"qwen_3_5": 2, "qwen_3": 3}, "flagged": [{"turn": 1}],
                                      "seconds": {"compile": 0.75, "scan": 1.5}}


def test_grammar_drafters_rows_are_the_forced_run_and_the_forced_run_then_the_heads_draft(tiny_checkpoint, tmp_path):
    import pandas as pd
    import xgrammar  # noqa: F401  (the [test] extra installs it: never skipped)

    from mtp_observe.run.options import ReplayOptions
    from mtp_observe.run.pipeline import replay

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    sessions = tmp_path / "s.jsonl"
    sessions.write_text((root / "sessions" / "coding.jsonl").read_text().splitlines()[0] + "\n")
    K = 3
    run = replay([sessions], tiny_checkpoint, tmp_path / "run",
                 ReplayOptions(k=K, device="cpu", drafters=("mtp", "grammar", "grammar+mtp"), grammar="tools"))
    t = pd.read_parquet(run / "positions.parquet")
    t["drafter"] = t["drafter"].astype(str)
    by = {name: t[t.drafter == name].set_index(["request", "pos", "depth"]).sort_index() for name in
          ("mtp", "grammar", "grammar+mtp")}
    g, h, m = by["grammar"], by["grammar+mtp"], by["mtp"]
    drafted = g[g.draft_token >= 0]
    assert len(drafted) > 0
    # the grammar drafter drafts only forced tokens, which are the recorded ones: every one accepted
    assert drafted.forced.all() and (drafted.draft_token == drafted.actual_token).all() and drafted.accepted.all()
    # sampled acceptance under the mask: a forced token is the one the renormalised distribution holds (probability
    # 1 under every profile); a draft the grammar refuses accepts with probability 0
    sampled = [c for c in t.columns if c.startswith("p_accept_")]
    assert sampled and (drafted[sampled] > 1 - 1e-5).all().all()
    assert (t.loc[~t.draft_allowed, sampled] == 0).all().all()
    # grammar+mtp: the forced run f, then the head's draft at anchor p + f
    f = (g.draft_token >= 0).groupby(level=[0, 1]).sum()
    checked = 0
    for (req, pos, depth), row in h.iterrows():
        n = int(f.loc[(req, pos)])
        if depth <= n:
            assert row.draft_token == g.loc[(req, pos, depth)].draft_token
        elif (req, pos + n, depth - n) in m.index:
            assert row.draft_token == m.loc[(req, pos + n, depth - n)].draft_token
            checked += int(n > 0)
    assert checked > 0
    # under greedy verification the mask never refuses an accepted draft; the column is read on every drafter
    assert not (t.accepted & ~t.draft_allowed).any() and (~t.draft_allowed).any()
