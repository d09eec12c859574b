"""Tree drafts: SGLang's rules pinned by value (against a plain recomputation and by cases where a wrong rule
changes the tree), TOPK = 1 as the chain, the recorded walk, and the verify rules (greedy, sampled, closed form)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtp_observe.drafting.tree import Grown, expand, grow, parse_tree, select, stable_topk
from mtp_observe.drafting.tree_acceptance import (
    KEPT,
    NOT_EXPANDED,
    NOT_PROPOSED,
    OFF_PATH,
    PRUNED,
    ExplicitTree,
    accept_length_distribution,
    explicit_tree,
    recorded_walk,
    verify_greedy,
    verify_sampled,
)
from mtp_observe.errors import OptionError
from mtp_observe.model.target import prefill_hidden

from .head_checks import reference
from .reference_tree import CORRECT_TREE, TreeReading, reference_grow, reference_select

N = 72
ANCHORS = [1, 2, 7, 19, 33, 48, 61, 70]


@pytest.fixture(scope="module")
def request_tokens(tiny_model):
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(0, tiny_model.info.geometry.vocab_size, (N,), generator=gen)
    return ids, prefill_hidden(tiny_model.target, ids, chunk_size=32)


@pytest.fixture(scope="module")
def rows(tiny_model, request_tokens):
    ids, hidden = request_tokens
    return tiny_model.head.row_pass(hidden[:-1], ids[1:])


# --- the bookkeeping, by hand ------------------------------------------------------------------


def _grown(scores, tokens, parent, first_child, K, S) -> Grown:
    t = lambda x, dt: torch.tensor([x], dtype=dt)  # noqa: E731
    return Grown(K, S, "slot", t(scores, torch.float32), t(tokens, torch.long), torch.zeros(1, len(scores)),
                 t(parent, torch.long), t(first_child, torch.long))


def test_the_docstring_worked_example_keeps_ids_0_1_2_and_grows_the_frontier_from_ids_2_and_4():
    level, chosen, best = expand(torch.tensor([[0.7, 0.2]]), torch.tensor([[[0.5, 0.2], [0.9, 0.05]]]))
    assert torch.allclose(level, torch.tensor([[0.35, 0.14, 0.18, 0.01]]))
    assert (2 + chosen).tolist() == [[2, 4]] and torch.allclose(best, torch.tensor([[0.35, 0.18]]))
    g = _grown([0.7, 0.2, *level[0].tolist()], list(range(6)), [-1, -1, 0, 0, 1, 1], [2, 4, -1, -1, -1, -1], 2, 2)
    assert torch.nonzero(select(g, 2, 4)[0]).squeeze(1).tolist() == [0, 1, 2]
    # A wrong frontier (each child's own probability) would keep ids 4 (0.9) and 2 (0.5): another order.
    assert stable_topk(torch.tensor([[0.5, 0.2, 0.9, 0.05]]), 2)[1].tolist() == [[2, 0]]


def test_ties_go_to_the_lower_id_so_a_parent_of_equal_score_is_always_kept_before_its_child():
    # node 1 (0.3) and its child node 4 (0.3 x 1.0) tie; T-1 = 2 keeps 0 and 1, never the orphan 4
    g = _grown([0.6, 0.3, 0.2, 0.1, 0.3, 0.0], [5, 6, 7, 8, 9, 10], [-1, -1, 0, 0, 1, 1], [2, 4, -1, -1, -1, -1], 2, 2)
    assert torch.nonzero(select(g, 2, 3)[0]).squeeze(1).tolist() == [0, 1]
    assert torch.nonzero(select(g, 2, 4)[0]).squeeze(1).tolist() == [0, 1, 4]


def test_the_t_minus_1_budget_keeps_the_best_scores_not_the_first_ids():
    # a deep node (0.5 x 0.9 = 0.45) beats a shallow one (0.1): the breadth-first rule would keep the shallow one
    g = _grown([0.5, 0.1, 0.45, 0.02, 0.05, 0.01], [1, 2, 3, 4, 5, 6], [-1, -1, 0, 0, 1, 1], [2, 4, -1, -1, -1, -1], 2, 2)
    kept = torch.nonzero(select(g, 2, 3)[0]).squeeze(1).tolist()
    assert kept == [0, 2] and kept != reference_select(np.array([0.5, 0.1, 0.45, 0.02, 0.05, 0.01]), 3,
                                                        TreeReading(prune="first")).tolist()


def test_the_recorded_walk_says_why_it_stops_at_each_depth():
    # K = 2, S = 3. Level 1: ids 0 (tok 10), 1 (tok 11). Level 2: children of slot 0 (id 0): ids 2 (20), 3 (21);
    # of slot 1 (id 1): ids 4 (22), 5 (23). Frontier for level 3: ids 2 and 5. Level 3: children of id 2: 6 (30),
    # 7 (31); of id 5: 8 (32), 9 (33).
    scores = [0.6, 0.3, 0.5, 0.05, 0.02, 0.2, 0.45, 0.01, 0.15, 0.04]
    tokens = [10, 11, 20, 21, 22, 23, 30, 31, 32, 33]
    parent = [-1, -1, 0, 0, 1, 1, 2, 2, 5, 5]
    first = [2, 4, 6, -1, -1, 8, -1, -1, -1, -1]
    g = _grown(scores, tokens, parent, first, 2, 3)
    kept = select(g, 3, 6)  # the 5 best: 0, 2, 6, 1, 5
    assert torch.nonzero(kept[0]).squeeze(1).tolist() == [0, 1, 2, 5, 6]

    def walk(continuation):
        w = recorded_walk(g, kept, 3, torch.tensor([continuation]))
        return w.status[0].tolist(), int(w.accepted[0]), w.draft[0].tolist()

    assert walk([10, 20, 30]) == ([KEPT, KEPT, KEPT], 3, [0, 2, 6])
    assert walk([10, 20, 31]) == ([KEPT, KEPT, PRUNED], 2, [0, 2, 6])  # 31 was grown, cut by T-1; the draft is 30
    assert walk([10, 21, 30]) == ([KEPT, PRUNED, NOT_EXPANDED], 1, [0, 2, -1])  # id 3 never left for the frontier
    assert walk([11, 22, 40]) == ([KEPT, PRUNED, NOT_EXPANDED], 1, [1, 5, -1])
    assert walk([11, 23, 32]) == ([KEPT, KEPT, PRUNED], 2, [1, 5, -1])  # id 8 (0.15) lost to the budget
    assert walk([12, 20, 30]) == ([NOT_PROPOSED, OFF_PATH, OFF_PATH], 0, [0, -1, -1])
    assert walk([10, 24, 30]) == ([KEPT, NOT_PROPOSED, OFF_PATH], 1, [0, 2, -1])


# --- the grown tree, by value ------------------------------------------------------------------


@pytest.mark.parametrize("attention", ["slot", "ancestors"])
def test_the_grown_tree_equals_a_plain_recomputation_at_every_anchor(tiny_model, request_tokens, rows, attention):
    ids, hidden = request_tokens
    K, S = 3, 3
    g = grow(tiny_model.head, rows, torch.tensor(ANCHORS), K, S, attention, attention_budget=4096)  # small blocks
    ref = reference(tiny_model)
    for a, p in enumerate(ANCHORS):
        scores, tokens, parents = reference_grow(ref, hidden, ids, p, K, S, TreeReading(attention=attention))
        assert g.tokens[a].tolist() == tokens.tolist(), f"anchor {p}"
        assert g.parent[a].tolist() == parents.tolist(), f"anchor {p}"
        assert np.allclose(g.scores[a].numpy(), scores, rtol=1e-4, atol=1e-7), f"anchor {p}"
        kept = torch.nonzero(select(g, S, 8)[a]).squeeze(1).numpy()
        assert kept.tolist() == reference_select(scores, 8).tolist()


@pytest.mark.parametrize("wrong", [
    TreeReading(fed_back="root"),  # every slot fed m_{p-1}, not its parent's output state
    TreeReading(positions="depth_plus_one"),  # forward i at p + i + 1 (the token's own position)
    TreeReading(attention="ancestors"),  # the true ancestors' KV where SGLang reads the slot's own
    TreeReading(attention="none"),  # the prefix alone, no earlier draft rows
    TreeReading(frontier="child"),  # the next frontier by the child's probability, not the running product
], ids=lambda r: next(f"{k}={v}" for k, v in vars(r).items() if getattr(CORRECT_TREE, k) != v))
def test_each_wrong_tree_rule_changes_the_tree(tiny_model, request_tokens, rows, wrong):
    ids, hidden = request_tokens
    K, S = 3, 3
    g = grow(tiny_model.head, rows, torch.tensor(ANCHORS), K, S, "slot")
    ref = reference(tiny_model)
    differs = False
    for a, p in enumerate(ANCHORS):
        scores, tokens, _ = reference_grow(ref, hidden, ids, p, K, S, wrong)
        differs |= g.tokens[a].tolist() != tokens.tolist() or not np.allclose(g.scores[a].numpy(), scores, rtol=1e-3)
    assert differs, f"{wrong}: the wrong rule grows the same trees"


def test_a_tree_of_topk_1_is_the_chain_at_every_anchor(tiny_model, request_tokens, rows):
    ids, hidden = request_tokens
    S = 4
    anchors = torch.arange(1, N - 1)
    chain = tiny_model.head.chain(rows, anchors, torch.full_like(anchors, S))
    for attention in ("slot", "ancestors"):
        g = grow(tiny_model.head, rows, anchors, 1, S, attention)
        assert torch.equal(g.tokens, chain.tokens)  # every anchor, every depth, not only where the drafts are accepted
        assert torch.allclose(g.logprobs, chain.logprobs, atol=1e-5)
        assert bool(select(g, S, S + 1).all())  # T = S + 1 keeps every node: the chain's path
        assert torch.allclose(g.scores, chain.logprobs.cumsum(1).exp(), rtol=1e-4)


def test_a_shallower_configuration_reads_the_first_levels_of_a_deeper_growth(tiny_model, rows):
    anchors = torch.tensor(ANCHORS)
    deep, shallow = grow(tiny_model.head, rows, anchors, 2, 4), grow(tiny_model.head, rows, anchors, 2, 2)
    n = shallow.nodes
    assert torch.equal(deep.tokens[:, :n], shallow.tokens) and torch.equal(deep.parent[:, :n], shallow.parent)
    assert torch.equal(select(deep, 2, 5), select(shallow, 2, 5))


# --- the verify rules ----------------------------------------------------------------------------


def _random_tree(rng, V=12, S=3, K=3, T=8):
    """An explicit tree SGLang could build: random draft scores, K children per frontier node."""
    probs = [rng.dirichlet(np.ones(V) * 0.5) for _ in range(1 + K + K * K)]
    scores = list(np.sort(rng.random(K))[::-1])
    tokens = list(rng.choice(V, K, replace=False))
    parents = [-1] * K
    for q in range(K):  # level 2 under each level-1 node
        scores += list(scores[q] * np.sort(rng.random(K))[::-1])
        tokens += list(rng.choice(V, K, replace=False))
        parents += [q] * K
    g = _grown(scores, tokens, parents, list(range(K, K + K * K, K)) + [-1] * K * K, K, 2)
    tree = explicit_tree(g, select(g, 2, T), 0, root_token=0)
    return tree, probs[: len(tree.tokens)]


def test_the_sampled_rule_is_lossless_and_its_accepted_length_has_the_closed_form(rng=np.random.default_rng(0)):
    tree, q = _random_tree(rng)
    S, runs = 2, 40_000
    lengths, first = np.zeros(S + 1), np.zeros(len(q[0]))
    for _ in range(runs):
        accepted, bonus = verify_sampled(tree, q, S, lambda u: rng.random(), rng.random())
        lengths[len(accepted)] += 1
        first[tree.tokens[accepted[0]] if accepted else bonus] += 1
    closed = accept_length_distribution(tree, q, S)
    assert np.abs(lengths / runs - closed).max() < 0.01, (lengths / runs, closed)
    assert np.abs(first / runs - q[0]).max() < 0.01  # the first committed token is a sample of the target's q_root
    # E[accept_len] = 1 + Σ P(reach w): the same number two ways
    assert abs((closed * np.arange(S + 1)).sum() + 1 - (1 + sum(
        np.prod([q[tree.parent[v]][tree.tokens[v]] for v in _path(tree, w)]) for w in range(1, len(tree.tokens))))) < 1e-9


def _path(tree: ExplicitTree, w: int) -> list[int]:
    out = []
    while w > 0:
        out.append(w)
        w = tree.parent[w]
    return out


def test_greedy_verification_follows_the_argmax_as_the_recorded_walk_follows_own_greedy_text():
    rng = np.random.default_rng(1)
    for _ in range(50):
        tree, q = _random_tree(rng)
        argmax = [int(np.argmax(x)) for x in q]
        accepted, bonus = verify_greedy(tree, argmax, 2)
        u = accepted[-1] if accepted else 0
        assert bonus == argmax[u]
        # the same by hand: follow the unique matching child
        v, n = 0, 0
        while n < 2:
            nxt = [c for c in tree.children(v) if tree.tokens[c] == argmax[v]]
            if not nxt:
                break
            v, n = nxt[0], n + 1
        assert len(accepted) == n


# --- the option ----------------------------------------------------------------------------------


def test_tree_configurations_are_parsed_and_refused_with_sglangs_bounds():
    t = parse_tree("3,4,8")
    assert (t.steps, t.topk, t.draft_tokens, t.attention, t.name, t.candidates) == (3, 4, 8, "slot", "tree:3,4,8", 36)
    assert parse_tree("2, 2, 4, ancestors").name == "tree:2,2,4,ancestors"
    assert t.sglang_args()[2:] == ["--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
                                   "--speculative-num-draft-tokens", "8"]
    for bad, said in [("3,4", "expected S,TOPK,T"), ("3,1,3", "pass 3,1,4"), ("2,2,8", "expected 2 to 1 + K + (S-1)K² = 7"),
                      ("0,2,3", "S = 0"), ("3,2,6,cousins", "expected S,TOPK,T"), ("3,99,8", "TOPK = 99")]:
        with pytest.raises(OptionError, match=None) as e:
            parse_tree(bad)
        assert said in str(e.value), (bad, str(e.value))
