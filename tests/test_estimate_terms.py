"""The estimate's extra terms (estimate_terms.py, issue 43 point 2): each what-if precision, the thresholds, the trees
priced in their own units, on top of the base replay; `replay --dry-run` prints the breakdown."""

from __future__ import annotations

import pytest

from mtp_observe.run.estimate import Estimate, Rates, ReplayWork, breakdown_lines, replay_seconds
from mtp_observe.run.estimate_terms import Term, term_seconds

from .test_replay import SESSION, write_sessions

PRECISIONS = ("bf16", "fp8", "int8", "nvfp4", "q8_0", "q6_k", "q4_k")
WORK = ReplayWork(sessions=7, requests=40, tokens=33_000, prefill=16_700, reused=16_300, anchors=3_165, drafts=12_300,
                  target_pairs=1_000_000, head_pairs=2_000_000, anchor_positions=1_500_000)


def _rates(*terms) -> Rates:
    return Rates(device="cpu", tokens=736, token_s=1e-4, pair_s=1e-9, full_layers=2, heads=4, call_s=0.01,
                 draft_s=4e-4, terms=terms)


def test_each_term_is_priced_in_its_own_unit_and_the_breakdown_names_each():
    """A what-if head: per request, prefilled token, draft row and the head's pairs again; the thresholds' confidence
    once per chain whatever their number; a tree per anchor and per draft query against the rows before it."""
    head = Term("what-if head q4_k", "its own row pass and chain", call_s=0.002, token_s=5e-5, row_s=3e-4, head_pairs=1)
    thresholds = Term("thresholds 0.3,0.5,0.8", "one confidence column", row_s=1e-5, scale=8)
    tree = Term("tree 3,4,8", "nodes per anchor", row_s=2e-3, per="anchor", tree_queries=8)
    rates = _rates(head, thresholds, tree)
    assert term_seconds(head, WORK, rates) == pytest.approx(40 * 0.002 + 16_700 * 5e-5 + 12_300 * 3e-4 + 2_000_000 * 4e-9)
    assert term_seconds(thresholds, WORK, rates) == pytest.approx(8 * 12_300 * 1e-5)
    assert term_seconds(tree, WORK, rates) == pytest.approx(3_165 * 2e-3 + 8 * 1_500_000 * 4e-9)
    base = replay_seconds(WORK, rates, terms=False)
    assert base == pytest.approx(replay_seconds(WORK, _rates()))
    assert replay_seconds(WORK, rates) == pytest.approx(base + sum(term_seconds(t, WORK, rates) for t in rates.terms))
    # proportions: twice the anchors, twice the tree's anchor part; the thresholds scale with the chains, not their count
    double = ReplayWork(**{**WORK.__dict__, "anchors": 2 * WORK.anchors, "anchor_positions": 2 * WORK.anchor_positions})
    assert term_seconds(tree, double, rates) == pytest.approx(2 * term_seconds(tree, WORK, rates))
    assert term_seconds(Term("t", "", row_s=1e-5, scale=1), WORK, rates) * 8 == pytest.approx(term_seconds(thresholds, WORK, rates))
    lines = breakdown_lines(Estimate(WORK, rates, k=4))
    assert [ln.split(":")[0] for ln in lines] == ["  base replay", "  + what-if head q4_k", "  + thresholds 0.3,0.5,0.8",
                                                  "  + tree 3,4,8"]
    assert lines[0] == "  base replay: 16.7k tokens, 12.3k draft rows · 7 s" and lines[3].endswith("· 6 s")
    assert breakdown_lines(Estimate(WORK, _rates(), k=4)) == []  # nothing beside the base: the estimate line alone
    assert Estimate(WORK, rates, k=4).point_s == pytest.approx(replay_seconds(WORK, rates))


def test_the_options_become_one_term_per_precision_one_for_the_thresholds_and_one_for_the_trees(tiny_model):
    from mtp_observe.drafting.tree import parse_tree
    from mtp_observe.run.estimate_terms import extra_terms
    from mtp_observe.run.options import ReplayOptions

    opts = ReplayOptions(head_precisions=PRECISIONS, draft_p_min=(0.3, 0.5, 0.8),
                         trees=(parse_tree("3,4,8"), parse_tree("2,4,5"), parse_tree("2,2,3")))
    specs = extra_terms(opts, tiny_model)
    assert [s.name for s in specs] == [f"what-if head {p}" for p in PRECISIONS] + ["thresholds 0.3,0.5,0.8",
                                                                                   "trees 3,4,8 2,4,5 2,2,3"]
    assert [s.head_pairs for s in specs[:7]] == [1] * 7
    assert specs[7].scale == 8 and "shared by all 3, over 8 chains" in specs[7].what  # served + 7 what-if chains
    tree = specs[8]
    # 3,4,8 and 2,4,5 share one grown tree (TOPK 4, as deep as 3): 2 forwards of 4 slots; 2,2,3: 1 forward of 2
    assert tree.per == "anchor" and tree.tree_queries == 2 * 4 + 1 * 2
    assert "3,4,8: 36 drafted + 7 verified" in tree.what  # K + (S-1)K² candidates, T-1 verified
    kwargs = [s.kwargs() for s in specs]
    assert list(kwargs[0]["whatifs"].heads) == ["bf16"] and not kwargs[0]["whatifs"].confidence
    assert kwargs[7]["whatifs"].heads == {} and kwargs[7]["whatifs"].confidence
    assert [t.name for t in kwargs[8]["variants"].trees] == ["tree:3,4,8", "tree:2,4,5", "tree:2,2,3"]
    assert extra_terms(ReplayOptions(), tiny_model) == [] and extra_terms(opts, None) == []


@pytest.fixture
def small_calibration(monkeypatch):
    """The calibration's synthetic requests made shorter (the tiny model's costs are its calls'): seconds, not a minute."""
    import mtp_observe.run.estimate as estimate

    monkeypatch.setattr(estimate, "CALIBRATION_SHORT", 32)
    monkeypatch.setattr(estimate, "CALIBRATION_TOKENS", 96)
    monkeypatch.setattr(estimate, "CALIBRATION_SPAN", 64)
    monkeypatch.setattr(estimate, "_CALIBRATED", {})


def test_calibrated_on_the_model_seven_precisions_cost_well_above_the_base_and_a_tree_above_a_plain_replay(
        tiny_checkpoint, tmp_path, small_calibration):
    """The reproduction's options priced by a real calibration (the run's own replay_request timed with each term
    on): seven what-if heads, each its own row pass, chain and reduced rows, more than double the base replay; a
    tree costs more than the plain replay."""
    from mtp_observe.drafting.tree import parse_tree
    from mtp_observe.run.options import ReplayOptions
    from mtp_observe.run.pipeline import replay_estimate

    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION, {**SESSION, "id": "two"}])
    whatifs = replay_estimate([sessions], tiny_checkpoint, ReplayOptions(device="cpu", head_precisions=PRECISIONS,
                                                                        draft_p_min=(0.3, 0.5, 0.8)))
    base = replay_seconds(whatifs.work, whatifs.rates, terms=False)
    assert [t.name for t in whatifs.rates.terms][-1] == "thresholds 0.3,0.5,0.8"
    assert whatifs.point_s > 2 * base
    assert sum(term_seconds(t, whatifs.work, whatifs.rates) > 0 for t in whatifs.rates.terms[:7]) >= 6
    tree = replay_estimate([sessions], tiny_checkpoint, ReplayOptions(device="cpu", trees=(parse_tree("3,4,8"),)))
    assert tree.work == whatifs.work and tree.point_s > replay_seconds(tree.work, tree.rates, terms=False)


def test_the_grammar_is_priced_per_tool_call_token_and_one_compile_per_session():
    """--grammar tools: xgrammar's scan per scored tool-call token (with every drafter's drafts checked there) and a
    compile of the session's tools once per session; nothing per draft row or per prefilled token."""
    grammar = Term("grammar tools", "xgrammar over each tool-call token", row_s=2e-4, per="tool_call", session_s=0.05)
    work = ReplayWork(**{**WORK.__dict__, "tool_call_tokens": 1_200})
    rates = _rates(grammar)
    assert term_seconds(grammar, work, rates) == pytest.approx(1_200 * 2e-4 + 7 * 0.05)
    more = ReplayWork(**{**work.__dict__, "tool_call_tokens": 2_400, "drafts": 3 * WORK.drafts, "prefill": 5 * WORK.prefill})
    assert term_seconds(grammar, more, rates) == pytest.approx(2_400 * 2e-4 + 7 * 0.05)
    assert term_seconds(grammar, WORK, rates) == pytest.approx(7 * 0.05)  # no tool call: its compiles alone


def test_the_work_counts_the_scored_tool_call_tokens_the_grammar_scans():
    from mtp_observe.run.estimate import replay_work
    from mtp_observe.sessions.rendering import END, TEXT, TOOL_CALL, RenderedSession, Request, Span

    segments = bytes([TEXT] * 4 + [TOOL_CALL] * 9 + [END])
    req = Request(0, list(range(40)), (Span(20, 33, 1, segments), Span(36, 38, 3, bytes([TEXT, TEXT, END]))))
    work = replay_work(RenderedSession(None, (req,)), 4, 2048, 2)
    assert work.tool_call_tokens == 9 and work.sessions == 1


def test_on_the_bundled_tokenizer_the_grammar_costs_a_positive_time_per_token_and_per_compile(tiny_model):
    from pathlib import Path
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    import mtp_observe
    from mtp_observe.run.estimate_terms import GRAMMAR_CALL, extra_terms, grammar_seconds
    from mtp_observe.run.options import ReplayOptions

    tok = AutoTokenizer.from_pretrained(Path(mtp_observe.__file__).parent / "default_model")
    renderer = SimpleNamespace(tokenizer=tok, vocab_size=None, eos_ids={tok.convert_tokens_to_ids("<|im_end|>")})
    per_token, per_session = grammar_seconds(renderer, 4, 2)
    assert 0 < per_token < 0.05 and 0 < per_session < 30
    assert len(tok.encode(GRAMMAR_CALL, add_special_tokens=False)) > 20  # a call of many tokens, not one
    (spec,) = extra_terms(ReplayOptions(drafters=("mtp", "grammar+mtp"), grammar="tools"), tiny_model, renderer)
    assert spec.name == "grammar tools" and spec.per == "tool_call" and "(2 drafters' drafts)" in spec.what
    assert extra_terms(ReplayOptions(grammar="tools"), tiny_model) == []  # no renderer (a caller without one): no term
