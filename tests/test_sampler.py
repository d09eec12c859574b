"""The serving sampler: penalties, temperature, min-p, top-k and top-p as vLLM applies them.

`vllm_sampler` below is vLLM's code path written out over the whole vocabulary in float64
(apply_penalties, the temperature, the min-p processor, apply_top_k_top_p's ascending sort and masks),
sharing nothing with mtp_observe.model.target; the hand-computed cases pin the penalties to numbers.
"""

from __future__ import annotations

import math

import pytest
import torch

from mtp_observe.model.penalties import PenaltyState, turn_penalty_state
from mtp_observe.model.target import (
    BUILTIN_PROFILES,
    VLLM_DEFAULTS,
    Distribution,
    SamplingProfile,
    Turns,
    generation_config_profile,
    profile_from_params,
    reduce_logits,
    sampler_distribution,
)


def vllm_sampler(logits_row: torch.Tensor, profile: SamplingProfile, prompt=(), output=()) -> torch.Tensor:
    """[V] logits -> [V] probabilities, in vLLM's order and with its masks (float64)."""
    x = logits_row.double().clone()
    V = x.shape[0]
    counts = torch.bincount(torch.tensor(list(output), dtype=torch.long), minlength=V).double()
    in_prompt = torch.bincount(torch.tensor(list(prompt), dtype=torch.long), minlength=V) > 0
    penalty = torch.where(in_prompt | (counts > 0), torch.tensor(profile.repetition_penalty, dtype=torch.float64), 1.0)
    x = x * torch.where(x > 0, 1.0 / penalty, penalty)
    x = x - profile.frequency_penalty * counts
    x = x - profile.presence_penalty * (counts > 0).double()
    if profile.temperature < 1e-5:
        return torch.nn.functional.one_hot(x.argmax(), V).double()
    x = x / profile.temperature
    if profile.min_p > 0:
        x = x.masked_fill(x < x.max() + math.log(profile.min_p), float("-inf"))
    srt, idx = x.sort()  # ascending, as apply_top_k_top_p
    if 0 < profile.top_k < V:
        srt = srt.masked_fill(srt < srt[V - profile.top_k], float("-inf"))
    if profile.top_p < 1:
        cum = torch.softmax(srt, -1).cumsum(-1)
        drop = cum <= 1 - profile.top_p
        drop[-1] = False
        srt = srt.masked_fill(drop, float("-inf"))
    probs = torch.zeros_like(x)
    probs[idx] = torch.softmax(srt, -1)
    return probs


def _logit_head(logits: torch.Tensor):
    """An lm_head and hidden states whose product is exactly `logits` ([n, V] with n <= V... via identity)."""
    n, V = logits.shape
    return torch.eye(V), torch.cat([logits, torch.zeros(1, V)])  # hidden [n + 1, V], lm_head [V, V]


# ---------------------------------------------------------------------------------------------
# Penalties by hand


def test_presence_and_frequency_penalties_change_p_accept_as_vllms_sampler_does_on_a_repeated_token():
    # Vocabulary of 4; the turn starts at s = 1 and has generated x_1..x_3 = 0, 0, 2 when position 3 emits x_4.
    # At position 3 the logits are (2.0, 1.0, 0.5, -1.0); token 0 was generated twice, token 2 once:
    #   presence 0.5, frequency 0.25:  token 0: 2.0 - 0.25 * 2 - 0.5 = 1.0;  token 2: 0.5 - 0.25 - 0.5 = -0.25
    #   -> softmax(1.0, 1.0, -0.25, -1.0) = e / (2e + e^-0.25 + e^-1) = 2.71828 / 6.58324 = 0.41291 for tokens 0 and 1.
    ids = torch.tensor([3, 0, 0, 2, 1, 1])
    logits = torch.zeros(5, 4)
    logits[3] = torch.tensor([2.0, 1.0, 0.5, -1.0])
    lm_head, hidden = _logit_head(logits)
    profile = SamplingProfile("pf", 1.0, presence_penalty=0.5, frequency_penalty=0.25)
    plain = SamplingProfile("plain", 1.0)
    turns = Turns(ids, torch.tensor([1]), torch.tensor([5]))
    drafts = torch.tensor([0, 1, 2, 3])
    red = reduce_logits(lm_head, hidden, torch.full((4,), 3), drafts, ids[4].repeat(4), (profile, plain), turns=turns)
    e = math.e
    total = 2 * e + math.exp(-0.25) + math.exp(-1)
    assert red.p_accept["pf"].tolist() == pytest.approx([e / total, e / total, math.exp(-0.25) / total, math.exp(-1) / total],
                                                        abs=1e-6)
    assert red.p_accept["pf"][0] == pytest.approx(0.41291, abs=1e-5)
    unpenalised = torch.softmax(torch.tensor([2.0, 1.0, 0.5, -1.0]), -1)
    assert red.p_accept["plain"].tolist() == pytest.approx(unpenalised.tolist(), abs=1e-6)  # 0.6095 for token 0
    # The same on the reference written from vLLM's code.
    want = vllm_sampler(logits[3], profile, prompt=ids[:1].tolist(), output=ids[1:4].tolist())
    assert red.p_accept["pf"].tolist() == pytest.approx(want.tolist(), abs=1e-6)


def test_the_repetition_penalty_divides_positive_logits_and_multiplies_negative_ones_over_prompt_and_output():
    # Prompt x_0 = 3, output so far x_1 = 0; logits (2.0, 1.0, 0.5, -1.0), repetition 2.0:
    #   token 0 (output, positive) 2.0 / 2 = 1.0; token 3 (prompt, negative) -1.0 * 2 = -2.0; tokens 1, 2 unchanged.
    ids = torch.tensor([3, 0, 1, 1])
    logits = torch.zeros(3, 4)
    logits[1] = torch.tensor([2.0, 1.0, 0.5, -1.0])
    lm_head, hidden = _logit_head(logits)
    profile = SamplingProfile("rep", 1.0, repetition_penalty=2.0)
    red = reduce_logits(lm_head, hidden, torch.full((4,), 1), torch.arange(4), ids[2].repeat(4), (profile,),
                        turns=Turns(ids, torch.tensor([1]), torch.tensor([3])))
    assert red.p_accept["rep"].tolist() == pytest.approx(torch.softmax(torch.tensor([1.0, 1.0, 0.5, -2.0]), -1).tolist(), abs=1e-6)


def test_the_fit_sums_of_a_span_are_the_recorded_tokens_probabilities_and_the_squares(tiny_model):
    # One span [s, e] = [2, 5] of a 7-token request: positions 1..4 emit x_2..x_5 (x_0 has no logits, the prompt x_0, x_1).
    W = tiny_model.target.lm_head.weight
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(7, W.shape[1], generator=gen) * 3
    ids = torch.randint(0, W.shape[0], (7,), generator=gen)
    logits = (hidden @ W.T).float()
    ids[3] = int(logits[2].argmax())  # some recorded tokens are the argmax
    profile = SamplingProfile("s", 0.8, top_p=0.9, top_k=12, presence_penalty=0.7)
    red = reduce_logits(W, hidden, torch.tensor([2]), torch.tensor([1]), torch.tensor([1]), (profile, BUILTIN_PROFILES[-1]),
                        turns=Turns(ids, torch.tensor([2]), torch.tensor([5])))
    q = [vllm_sampler(logits[j], profile, prompt=ids[:2].tolist(), output=ids[2 : j + 1].tolist()) for j in range(1, 5)]
    qx = torch.stack([q[t][ids[t + 2]] for t in range(4)])
    fit = red.fit["s"]
    assert red.fit_tokens.tolist() == [4]
    assert fit.support.tolist() == [int((qx > 0).sum())]
    assert float(fit.q[0]) == pytest.approx(float(qx.sum()), abs=1e-6)
    assert float(fit.q2[0]) == pytest.approx(float(sum((d ** 2).sum() for d in q)), abs=1e-6)
    assert float(fit.var[0]) == pytest.approx(float(sum((d ** 3).sum() - (d ** 2).sum() ** 2 for d in q)), abs=1e-6)
    assert float(fit.ll[0]) == pytest.approx(float(sum(torch.log(x) for x in qx if x > 0)), abs=1e-5)
    greedy = red.fit["greedy"]  # greedy: q is a point mass, Σ q² = 1, no variance
    hits = sum(int(ids[t + 1] == logits[t].argmax()) for t in range(1, 5))
    assert greedy.support.tolist() == [hits] and float(greedy.q[0]) == hits and float(greedy.q2[0]) == 4
    assert float(greedy.var[0]) == 0 and float(greedy.ll[0]) == 0 and hits >= 1


# ---------------------------------------------------------------------------------------------
# Against vLLM's code path


PROFILES = [
    SamplingProfile("t", 0.7),
    SamplingProfile("k", 1.0, top_k=5),
    SamplingProfile("kp", 0.6, top_p=0.9, top_k=20),
    SamplingProfile("p", 1.3, top_p=0.8),
    SamplingProfile("m", 1.0, min_p=0.1),
    SamplingProfile("mkp", 0.9, top_p=0.95, top_k=7, min_p=0.05),
    SamplingProfile("pen", 1.0, top_p=0.95, top_k=20, presence_penalty=1.5, frequency_penalty=0.3, repetition_penalty=1.3),
    SamplingProfile("neg", 0.8, top_k=30, presence_penalty=-1.0, repetition_penalty=0.8),
    SamplingProfile("greedy_pen", 0.0, presence_penalty=5.0),
    *BUILTIN_PROFILES,
]


@pytest.mark.parametrize("profile", PROFILES, ids=[p.name for p in PROFILES])
def test_sampler_distribution_equals_vllms_code_path(profile):
    gen = torch.Generator().manual_seed(7)
    V, c = 300, 6
    logits = torch.randn(c, V, generator=gen) * 3
    logits[2, :40] = logits[2, 0]  # many exact ties at the top (top-k keeps every tied logit)
    logits[3] = torch.round(logits[3])  # ties everywhere, as bf16 logits have
    prompts = [torch.randint(0, V, (int(torch.randint(0, 30, (1,), generator=gen)),), generator=gen).tolist() for _ in range(c)]
    outputs = [torch.randint(0, 40, (int(torch.randint(0, 25, (1,), generator=gen)),), generator=gen).tolist() for _ in range(c)]
    state = PenaltyState.from_tokens(prompts, outputs)
    before = logits.clone()
    dist = sampler_distribution(logits, profile, state)
    assert torch.equal(logits, before)  # the penalties were written in place and restored
    got = dist.dense(V).double()
    for r in range(c):
        want = vllm_sampler(logits[r], profile, prompts[r], outputs[r])
        if r == 3 and profile.top_p < 1:  # a top-p cut inside a run of exactly tied logits: which of them stay is
            got_r, want = got[r].sort().values, want.sort().values  # the sort's order, in vLLM as here; how many is not
        else:
            got_r = got[r]
        assert torch.allclose(got_r, want, atol=1e-5), (profile.name, r, (got_r - want).abs().max())
        assert got[r].sum() == pytest.approx(1.0, abs=1e-5)
    rows = torch.arange(c).repeat_interleave(V)
    tokens = torch.arange(V).repeat(c)
    assert torch.allclose(dist.at(rows, tokens).double(), got.reshape(-1), atol=1e-6)
    assert torch.allclose(dist.power_sum(2).double(), (got ** 2).sum(-1), atol=1e-5)


def test_top_k_keeps_every_logit_tied_with_the_kth_even_past_the_ranking_slack():
    logits = torch.tensor([[3.0] + [1.0] * 20 + [0.0] * 10])
    dist = sampler_distribution(logits, SamplingProfile("k", 1.0, top_k=2))
    probs = dist.dense(31)[0]
    assert int((probs > 0).sum()) == 21  # the 3.0 and all twenty logits tied at the 2nd value
    assert torch.allclose(probs, vllm_sampler(logits[0], SamplingProfile("k", 1.0, top_k=2)).float(), atol=1e-6)


def test_tritons_top_k_keeps_exactly_k_and_breaks_ties_at_the_kth_by_the_lowest_token_id():
    """vllm/v1/sample/ops/topk_topp_triton.py:851-875: of the values tied with the k-th, the first `num_keep` in
    index order survive; the PyTorch top-k (topk_topp_sampler.py:524-565) keeps them all."""
    profile = SamplingProfile("k", 1.0, top_k=2)
    logits = torch.tensor([[1.0, 2.0, 0.0, 1.0], [1.0, 0.0, 2.0, 1.0]])
    e = math.e
    triton = sampler_distribution(logits, profile, ties="index").dense(4)
    assert torch.allclose(triton, torch.tensor([[1 / (1 + e), e / (1 + e), 0, 0], [1 / (1 + e), 0, e / (1 + e), 0]]))
    everything = sampler_distribution(logits, profile, ties="all").dense(4)
    assert torch.allclose(everything, torch.tensor([[1, e, 0, 1], [1, 0, e, 1]]) / (2 + e))
    # past the ranking slack (twenty ties for the 2nd place): tokens 0 (3.0) and 1, the lowest id of the ties
    wide = torch.tensor([[3.0] + [1.0] * 20 + [0.0] * 10]).flip(-1)  # the 3.0 now at id 30, ties at ids 10..29
    probs = sampler_distribution(wide, profile, ties="index").dense(31)[0]
    assert torch.nonzero(probs).squeeze(1).tolist() == [10, 30]
    # no tie at the k-th value: both rules agree
    plain = torch.tensor([[0.3, 2.0, 1.0, 0.5]])
    assert torch.equal(sampler_distribution(plain, profile, ties="index").dense(4),
                       sampler_distribution(plain, profile, ties="all").dense(4))


def test_draft_rows_of_a_v1_drafter_are_scored_without_min_p_and_the_others_with_it():
    """vllm/v1/sample/rejection_sampler.py:589-643 (V1) scores a draft position with temperature and top-k / top-p
    only; V2 (vllm/v1/worker/gpu/spec_decode/rejection_sampler.py:250-296) with min-p too. Logits (2, 1, 0, -3), T 1,
    min_p 0.1: softmax (0.6623, 0.2436, 0.0896, 0.00446); min-p drops token 3 (< 0.1 x 0.6623) and renormalises."""
    row = torch.tensor([[2.0, 1.0, 0.0, -3.0]])
    lm_head, hidden = _logit_head(row)
    profile = SamplingProfile("mp", 1.0, min_p=0.1)
    positions, drafts = torch.tensor([0, 0, 0, 0]), torch.tensor([3, 0, 3, 0])
    v1 = torch.tensor([True, True, False, False])
    got = reduce_logits(lm_head, hidden, positions, drafts, drafts, (profile,), no_min_p=v1).p_accept["mp"]
    p = torch.softmax(row[0].double(), -1)
    kept = p[:3] / p[:3].sum()
    assert torch.allclose(got.double(), torch.stack([p[3], p[0], torch.tensor(0.0, dtype=torch.float64), kept[0]]),
                          atol=1e-6)
    assert torch.equal(reduce_logits(lm_head, hidden, positions, drafts, drafts, (profile,)).p_accept["mp"],
                       reduce_logits(lm_head, hidden, positions, drafts, drafts, (profile,),
                                     no_min_p=torch.zeros(4, dtype=torch.bool)).p_accept["mp"])


def test_the_turn_penalty_state_equals_the_state_built_from_each_rows_token_lists():
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 50, (120,), generator=gen)
    # two turns [20, 60] and [75, 110]: rows at s-1..e-1 of each, in a scrambled order
    positions = torch.cat([torch.arange(19, 60), torch.arange(74, 110)])
    starts = torch.cat([torch.full((41,), 20), torch.full((36,), 75)])
    perm = torch.randperm(positions.shape[0], generator=gen)
    positions, starts = positions[perm], starts[perm]
    state = turn_penalty_state(ids, starts, positions, with_prompt=True)
    expected = PenaltyState.from_tokens([ids[: int(s)].tolist() for s in starts],
                                        [ids[int(s) : int(j) + 1].tolist() for s, j in zip(starts, positions)])

    def dense(st: PenaltyState):
        prompt = torch.zeros(positions.shape[0], 50, dtype=torch.bool)
        counts = torch.zeros(positions.shape[0], 50, dtype=torch.int32)
        prompt[:, st.tokens] = st.in_prompt
        counts[:, st.tokens] = st.output_counts
        return prompt, counts

    for a, b in zip(dense(state), dense(expected)):
        assert torch.equal(a, b)
    without = turn_penalty_state(ids, starts, positions, with_prompt=False)
    assert not without.in_prompt.any() and torch.equal(dense(without)[1], dense(expected)[1])


# ---------------------------------------------------------------------------------------------
# Profiles from parameters


def test_sampling_params_from_a_log_fill_missing_keys_and_are_checked_as_vllm_checks_them():
    base = SamplingProfile("gen", 0.6, top_p=0.95, top_k=20)
    p = profile_from_params("recorded", {"temperature": 0.7, "top_k": -1, "presence_penalty": 1.5, "seed": 3,
                                         "max_tokens": 100, "top_p": None}, base)
    assert (p.temperature, p.top_p, p.top_k, p.presence_penalty, p.min_p) == (0.7, 0.95, 0, 1.5, 0.0)
    for bad, needle in (({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": 2.5}, "top_k"),
                        ({"min_p": 2}, "min_p"), ({"presence_penalty": 3}, "presence_penalty"),
                        ({"repetition_penalty": 0}, "repetition_penalty"), ({"temperature": "hot"}, "temperature")):
        with pytest.raises(ValueError, match=needle):
            profile_from_params("x", bad, VLLM_DEFAULTS)


def test_the_generation_config_sampler_is_what_vllm_reads_from_the_checkpoint(tmp_path):
    from mtp_observe.model.loading import default_model_dir

    bundled = generation_config_profile(default_model_dir())
    assert bundled is not None and (bundled.temperature, bundled.top_p, bundled.top_k) == (0.6, 0.95, 20)
    assert generation_config_profile(tmp_path) is None  # no file: no profile
    (tmp_path / "generation_config.json").write_text('{"do_sample": false, "repetition_penalty": 1.05}')
    p = generation_config_profile(tmp_path)
    assert (p.temperature, p.repetition_penalty, p.top_k) == (1.0, 1.05, 0)  # vLLM ignores do_sample


def test_a_dense_distribution_puts_each_kept_probability_at_its_token():
    d = Distribution(torch.tensor([[0.25, 0.75]]), torch.tensor([[3, 1]]))
    assert d.dense(5).tolist() == [[0.0, 0.75, 0.0, 0.25, 0.0]]
    assert d.at(torch.tensor([0, 0]), torch.tensor([1, 2])).tolist() == [0.75, 0.0]


def test_the_penalised_ranking_from_the_raw_one_is_the_top_of_the_penalised_logits():
    from mtp_observe.model.penalties import penalised, penalised_ranking

    gen = torch.Generator().manual_seed(5)
    c, V = 40, 500
    logits = torch.randn(c, V, generator=gen) * 2
    logits[:, :40] += 6  # forty tokens lead every row ...
    outputs = [list(range(0, 40 if r % 2 else 5)) for r in range(c)]  # ... and half the rows have generated all of them
    state = PenaltyState.from_tokens([[]] * c, outputs)
    raw = logits.topk(20 + 8 + 32, dim=-1)
    # presence 8 pushes forty ranked tokens down on the odd rows (ranked again) and five on the even ones (merged)
    with penalised(logits, (1.0, 0.0, 8.0), state):
        values, index = penalised_ranking(raw, logits, state, 28)
        want = logits.topk(28, dim=-1)
        assert torch.equal(logits.gather(1, index), values)  # the indices hold those values
    assert torch.equal(values, want.values)
