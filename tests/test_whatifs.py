"""What-ifs from one replay: the head at other precisions and drafting that stops when the head is unsure.

The bf16 head of a BF16 checkpoint is the served head exactly; the fp8 what-if is exactly an FP8 checkpoint's head read
through the FP8 loader; threshold 0 is fixed K exactly and threshold 1 never drafts; the stop compares llama.cpp's
probability (the head's softmax over its top ten logits), and the walk equals a real draft-and-verify loop with that
stop, which comparing another probability would not."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from mtp_observe.model import precisions
from mtp_observe.model.loading import load_model
from mtp_observe.model.mtp import draft_confidence
from mtp_observe.model.synthetic import write_fp8_copy
from mtp_observe.report import load_run, read_and_summarize, report_json, simulated_walks, summarize
from mtp_observe.report.whatifs import drafted_lengths, stopped_speedup, stopped_walks
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay

from .fuzzing import run_cli
from .test_replay import SESSION, write_sessions

# q_proj rows 2*4*32 = 256 (two whole 128-blocks), the dense MLP's 200 (a whole block and a partial one); bf16 weights
SPEC = dict(dtype="bfloat16", intermediate_size=200)
KEY = ["session_id", "request", "pos", "depth"]


def sessions_file(directory: Path, n: int = 3) -> Path:
    return write_sessions(directory / "s.jsonl", [dict(SESSION, id=f"demo-{i}") for i in range(n)])


def rows_of(run: Path, precision: str | None = None) -> pd.DataFrame:
    rows = pd.read_parquet(run / "positions.parquet")
    if "head_precision" in rows:
        rows = rows[rows.head_precision.isna()] if precision is None else rows[rows.head_precision == precision]
        rows = rows.drop(columns="head_precision")
    return rows.drop(columns=[c for c in ("draft_confidence",) if c in rows]).sort_values(KEY).reset_index(drop=True)


@pytest.fixture(scope="module")
def runs(make_checkpoint, tmp_path_factory):
    """The bf16 checkpoint replayed plain, and with what-ifs; its head-only FP8 copy replayed plain."""
    base = tmp_path_factory.mktemp("whatifs")
    model = make_checkpoint(**SPEC)
    files = [sessions_file(base)]
    plain = replay(files, model, base / "plain", ReplayOptions(k=2, device="cpu"))
    whatif = replay(files, model, base / "whatif", ReplayOptions(k=2, device="cpu", head_precisions=("bf16", "fp8", "q4_k"),
                                                                 draft_p_min=(0.3, 1.0)))
    fp8 = write_fp8_copy(model, base / "fp8-head", only_head=True)
    served_fp8 = replay(files, fp8, base / "fp8-run", ReplayOptions(k=2, device="cpu"))
    return {"model": model, "plain": plain, "whatif": whatif, "fp8": fp8, "fp8_run": served_fp8}


def assert_rows_equal(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert len(a) == len(b) > 100
    assert list(a.columns) == list(b.columns)
    for column in a.columns:
        x, y = a[column], b[column]
        if x.dtype.kind == "f":
            assert np.array_equal(x.to_numpy(), y.to_numpy(), equal_nan=True), column
        else:
            assert (x.astype(str) == y.astype(str)).all(), column


# --- the head at other precisions --------------------------------------------------------------------


def test_the_bf16_what_if_of_a_bf16_checkpoint_is_the_plain_run_exactly(runs):
    served = rows_of(runs["whatif"])
    assert_rows_equal(served, rows_of(runs["plain"]))  # the what-ifs leave the served rows as they were
    assert_rows_equal(rows_of(runs["whatif"], "bf16"), served)
    manifest = json.loads((runs["whatif"] / "run.json").read_text())
    bytes_bf16 = manifest["model"]["head_precisions"]["bf16"]
    assert bytes_bf16["draft_cost"] == pytest.approx(manifest["model"]["roofline"]["draft_cost"], rel=1e-12)


def test_the_bf16_what_if_of_a_float32_checkpoint_rounds_its_weights(tiny_checkpoint, tmp_path):
    run = replay([sessions_file(tmp_path, 1)], tiny_checkpoint, tmp_path / "run",
                 ReplayOptions(k=2, device="cpu", head_precisions=("bf16",)))
    served, bf16 = rows_of(run), rows_of(run, "bf16")
    assert (served.draft_logprob - bf16.draft_logprob).abs().max() > 1e-4  # a negative control: bf16 is not the identity


def test_the_fp8_what_if_is_an_fp8_checkpoints_head_read_through_the_fp8_loader(runs):
    from mtp_observe.model.checkpoint import read_checkpoint

    info = read_checkpoint(runs["fp8"])
    fp8 = [n for n, e in info.tensors.items() if e.dtype == "F8_E4M3"]
    assert fp8 and all(n.startswith("mtp.") for n in fp8) and "mtp.fc.weight" not in fp8
    assert_rows_equal(rows_of(runs["whatif"], "fp8"), rows_of(runs["fp8_run"]))
    assert not rows_of(runs["whatif"], "fp8").draft_logprob.equals(rows_of(runs["whatif"]).draft_logprob)


@pytest.mark.parametrize("family", [dict(family="qwen3_next", layout="text", moe_intermediate_size=160,
                                         shared_expert_intermediate_size=136, dtype="bfloat16")], ids=["qwen3_next"])
def test_the_fp8_what_if_of_a_moe_head_quantises_each_experts_gate_and_up_as_its_own_matrix(make_checkpoint, tmp_path,
                                                                                            family):
    model = make_checkpoint(**family)  # per-expert layout: gate [160, H] and up [160, H] their own 128-blocks
    files = [sessions_file(tmp_path, 1)]
    whatif = replay(files, model, tmp_path / "w", ReplayOptions(k=2, device="cpu", head_precisions=("fp8",)))
    served = replay(files, write_fp8_copy(model, tmp_path / "fp8", only_head=True), tmp_path / "s", ReplayOptions(k=2, device="cpu"))
    assert_rows_equal(rows_of(whatif, "fp8"), rows_of(served))


def test_each_precision_keeps_what_its_formats_recipe_keeps(tiny_model):
    g = tiny_model.info.geometry
    shapes = precisions.head_shapes(g)
    r = {p: precisions.recipe(p, shapes, (g.vocab_size, g.hidden_size), False) for p in ("fp8", "nvfp4", "q6_k", "q4_k")}
    assert r["fp8"].formats["fc.weight"] is None and r["fp8"].formats["layers.0.self_attn.q_proj.weight"] == "fp8_block"
    assert r["nvfp4"].formats["fc.weight"] == "nvfp4" and r["nvfp4"].lm_head is None and r["nvfp4"].embedding is None
    assert all(f is None for n, f in r["q4_k"].formats.items() if shapes[n] and len(shapes[n]) == 1)
    # rows of 64 (hidden) fall back from Q4_K to Q5_0 and from Q6_K to Q8_0, as llama-quantize does; the lm_head's
    # rows of 64 are not a multiple of 256 either: Q8_0 (llama_tensor_get_type_impl)
    assert r["q4_k"].formats["layers.0.self_attn.q_proj.weight"] == "q5_0"
    assert r["q6_k"].formats["layers.0.self_attn.q_proj.weight"] == "q8_0"
    assert r["q4_k"].lm_head == "q8_0" and r["q4_k"].embedding == "q5_0"
    assert any("Q5_0 (llama-quantize's fallback)" in f for f in r["q4_k"].fallbacks)
    wide = precisions.recipe("q4_k", {"w": (8, 512)}, (1000, 512), False)
    assert wide.formats["w"] == "q4_k" and wide.lm_head == "q6_k" and wide.embedding == "q4_k"
    assert precisions.recipe("q8_0", {"w": (8, 512)}, (1000, 512), True).lm_head == "q8_0"


def test_nvfp4_modules_serving_fuses_share_one_global_scale(tiny_model):
    head = tiny_model.head
    r = precisions.recipe("nvfp4", precisions.head_shapes(head.geometry), (head.geometry.vocab_size, head.geometry.hidden_size),
                          False)
    tensors = head.named_weights()
    out = precisions.quantised_tensors(tensors, r)
    from mtp_observe.model.quantisers import round_trip

    q, k, v = (tensors[f"layers.0.self_attn.{n}_proj.weight"] for n in "qkv")
    shared = torch.stack([q.abs().amax(), k.abs().amax(), v.abs().amax()]).amax()
    assert torch.equal(out["layers.0.self_attn.k_proj.weight"], round_trip(k, "nvfp4", shared))
    assert not torch.equal(out["layers.0.self_attn.k_proj.weight"], round_trip(k, "nvfp4"))  # its own would differ
    assert torch.equal(out["layers.0.self_attn.o_proj.weight"], round_trip(tensors["layers.0.self_attn.o_proj.weight"], "nvfp4"))


def test_a_precision_llama_quantize_cannot_write_is_one_line_and_exit_2(runs, tmp_path):
    path = sessions_file(tmp_path, 1)
    code, _, err = run_cli(["replay", str(path), "--model", str(runs["model"]), "--out", str(tmp_path / "r"),
                            "--head-precision", "q8_0"])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "rows of 200 values, not a multiple of 32" in err and "drop it from --head-precision" in err
    code, _, err = run_cli(["replay", str(path), "--model", str(runs["model"]), "--out", str(tmp_path / "r"),
                            "--head-precision", "fp4"])
    assert code == 2 and "unknown fp4" in err and "nvfp4" in err
    code, _, err = run_cli(["replay", str(path), "--model", str(runs["model"]), "--out", str(tmp_path / "r"),
                            "--draft-p-min", "0.5,1.5"])
    assert code == 2 and "--draft-p-min 1.5" in err
    code, _, err = run_cli(["replay", str(path), "--model", str(runs["model"]), "--out", str(tmp_path / "r"),
                            "--draft-p-min", "0.5", "--drafters", "ngram"])
    assert code == 2 and "add mtp to --drafters" in err


def test_a_resumed_what_if_run_counts_every_precisions_rows_as_whole(runs):
    from mtp_observe.run import parts, tables

    (name,) = tables.done_parts(runs["whatif"])
    sessions, why = parts.read_part(runs["whatif"], name, 2, [2] * 4)  # the served head's rows and three precisions'
    assert why is None and len(sessions) == 3
    assert parts.read_part(runs["whatif"], name, 2, [2])[0] is None  # counting the served rows alone finds them wrong


# --- the confidence stop -------------------------------------------------------------------------------


def test_the_confidence_is_llama_cpps_top_ten_softmax_of_the_heads_own_logits(tiny_model):
    head = tiny_model.head
    torch.manual_seed(0)
    states = torch.randn(20, head.geometry.hidden_size)
    logits = head.logits(states)
    reference = torch.softmax(logits.double().topk(10).values, dim=-1)[:, 0]
    assert torch.allclose(draft_confidence(logits), reference, rtol=1e-12, atol=0)
    whole = torch.softmax(logits.double(), dim=-1).max(dim=-1).values
    assert (whole < reference).all()  # the whole vocabulary's softmax is smaller: truncation comes first


def test_the_chains_own_stop_is_the_rule_the_report_applies(tiny_model):
    head = tiny_model.head
    torch.manual_seed(1)
    n = 120
    rows = head.row_pass(torch.randn(n, head.geometry.hidden_size), torch.randint(0, head.geometry.vocab_size, (n,)))
    anchors = torch.arange(5, 100)
    depths = torch.full_like(anchors, 4)
    free = head.chain(rows, anchors, depths, confidence=True)
    zero = head.chain(rows, anchors, depths, p_min=0.0)
    assert torch.equal(zero.tokens, free.tokens) and torch.equal(zero.logprobs, free.logprobs)
    assert torch.equal(zero.confidence, free.confidence) and bool((zero.drafted == 4).all())
    for theta in np.quantile(free.confidence.numpy(), [0.1, 0.3, 0.6]).tolist():  # thresholds among the confidences
        stopped = head.chain(rows, anchors, depths, p_min=theta)
        L, passes = drafted_lengths(free.confidence.numpy(), theta, 4)
        assert np.array_equal(stopped.drafted.numpy(), L), theta
        kept = torch.arange(4)[None, :] < stopped.drafted[:, None]
        assert torch.equal(stopped.tokens[kept], free.tokens[kept]) and bool((stopped.tokens[~kept] == -1).all())
        assert 0 < L.mean() < 4, theta  # the rule fires, and not everywhere
    assert bool((head.chain(rows, anchors, depths, p_min=1.0).drafted == 0).all())  # threshold 1 never drafts


def test_threshold_0_walks_exactly_the_fixed_k_decode_and_threshold_1_never_drafts(runs):
    run = load_run(runs["whatif"])
    assert run.rows.confidence is not None
    report = summarize(run, _cost(run), replicates=200, seed=0)
    counts = stopped_walks(run, (0.0, 1.0))
    steps, step_accepted, step_drafted = simulated_walks(run)
    assert step_drafted is None  # the head drafts K at every step (metrics: draft_len only for other drafters)
    assert np.array_equal(counts.steps[:, 0], steps)
    assert np.array_equal(counts.accepted[:, 0], step_accepted.sum(axis=-1))
    c, v = np.array([report.cost.c]), report.cost.verify_extra[None, :]
    total = counts.total()
    tau, speed = stopped_speedup(total.tokens, total.steps, total.passes, total.hist, c, v)
    assert np.array_equal(tau[0], report.overall.value.tau_sim)
    assert np.array_equal(speed[0, 0], report.overall.value.speedup)  # bit for bit, not approximately
    assert np.array_equal(tau[1], np.ones(run.k))  # threshold 1: one token a step
    assert np.allclose(speed[0, 1], 1.0 / (1.0 + report.cost.c))  # and one draft step, then a plain decode
    assert not total.hist[1, :, 1:].any()


def _cost(run):
    from mtp_observe.report import drafter_cost, resolve_cost

    return drafter_cost(resolve_cost(run), run.drafter)


def _run_as(doc: dict, run) -> dict:
    """The report JSON with the run's own directory (which the verdict's next steps name) written RUN."""
    return json.loads(json.dumps(doc).replace(json.dumps(str(run))[1:-1], "RUN"))


def test_the_report_puts_the_what_ifs_beside_a_verdict_about_the_served_head(runs):
    kwargs = dict(replicates=200, seed=0)
    with_ifs = read_and_summarize(runs["whatif"], **kwargs)
    plain = read_and_summarize(runs["plain"], **kwargs)
    a, b = report_json(with_ifs.report), report_json(plain.report)
    a, b = _run_as(a, runs["whatif"]), _run_as(b, runs["plain"])  # the next steps name each run's own directory
    assert a["verdict"] == b["verdict"] and a["best"] == b["best"]  # the verdict is about what is served
    assert b["head_precisions"] == [] and b["draft_p_min"] == [] and b["whatifs"] is None
    assert [r["precision"] for r in a["head_precisions"]] == ["bf16", "fp8", "q4_k"]
    bf16 = a["head_precisions"][0]
    assert bf16["speedup"] == a["best"]["speedup"] and bf16["gain"] == 0.0 and bf16["drafts_equal"] == 1.0
    assert set(bf16) >= {"precision", "alpha", "tau_sim", "c", "speedup"}
    assert a["head_precisions"][2]["c"] < bf16["c"]  # Q5_0 / F16 / Q8_0 bytes under BF16's
    assert [r["threshold"] for r in a["draft_p_min"]] == [0.3, 1.0]
    assert set(a["draft_p_min"][0]) >= {"threshold", "tau_sim", "speedup"}
    assert a["draft_p_min"][1]["tau_sim"] == 1.0
    best = a["whatifs"]["best"]
    assert best["line"].startswith("what-if: ") and "not the verdict" in best["line"]
    assert len(a["whatifs"]["by_batch"]) == len(a["batch"]["batch_sizes"])
    assert {x["name"] for x in a["whatifs"]["by_segment"]} <= {"reasoning", "text", "tool_call", "end"}


def test_a_version_2_run_reads_as_it_did_and_lacks_only_the_what_ifs(runs, tmp_path):
    import shutil

    old = Path(shutil.copytree(runs["plain"], tmp_path / "v2"))
    manifest = json.loads((old / "run.json").read_text())
    assert manifest["schema_version"] == 6 and manifest["whatifs"] is None
    del manifest["whatifs"], manifest["model"]["head_precisions"]
    (old / "run.json").write_text(json.dumps(manifest | {"schema_version": 2}))
    a = _run_as(report_json(read_and_summarize(old, replicates=100, seed=0).report), old)
    b = _run_as(report_json(read_and_summarize(runs["plain"], replicates=100, seed=0).report), runs["plain"])
    assert a["run"]["schema_version"] == 2 and a["head_precisions"] == [] and a["whatifs"] is None
    for doc in (a, b):
        doc["run"] = {key: value for key, value in doc["run"].items() if key not in ("path", "schema_version")}
    # the other version-3 additions (trees, serving numerics, session order) say what a version-2 run lacks; no note
    # is about the what-ifs, which a run without them never asked for
    older = [n for n in a["notes"] if n not in b["notes"]]
    assert older and all(n.startswith(("schema_version 2 run", "a run written before schema_version 3")) for n in older)
    assert not any("head-precision" in n or "draft-p-min" in n for n in older)
    a["notes"] = [n for n in a["notes"] if n not in older]
    assert a == b


def test_the_what_if_tables_print_under_the_report(runs):
    code, out, err = run_cli(["report", str(runs["whatif"]), "--replicates", "100", "--details"])  # the what-if tables are details
    assert code == 0, err
    assert "what-if: the head at other precisions" in out and "what-if: drafting that stops" in out
    assert "what-if: " in out.split("acceptance and projected speedup by K")[0]  # the one line, above the tables


# --- the stop equals a real draft-and-verify loop, and the wrong probability does not ----------------------------------


def stopping_speculative_decode(target, head, x: list[int], s: int, k: int, theta: float) -> list[tuple[int, int, int]]:
    """Greedy speculative decoding with llama.cpp's --draft-p-min over a greedy trajectory x (prompt x[:s], x_s from the
    prefill): at anchor p the head drafts step by step until a draft's probability (softmax over its top ten logits)
    is below theta, which is dropped; the target verifies the drafts kept. -> [(p, drafts verified, accepted)].
    Past the trajectory's last token there is nothing to score a draft against, and the replay has no row there:
    both take the head to draft on (and count no acceptance past it)."""
    def forward(seq):
        with torch.no_grad():
            out = target.model(input_ids=torch.tensor(seq)[None]).last_hidden_state[0]
            return out, target.lm_head(out).double()

    steps, p, e = [], s, len(x) - 1
    while p < e:
        hidden, _ = forward(x[:p])
        drafts, logits = head.draft(hidden, torch.tensor(x), p, k)
        kept = []
        for j, (d, lg) in enumerate(zip(drafts, logits)):
            if j < e - p and float(torch.softmax(lg.double().topk(10).values, -1)[0]) < theta:
                break
            kept.append(d)
        _, verify = forward(x[: p + 1] + kept)  # verify[p + j] predicts the token after x_p, d_1..d_j
        a = 0
        while a < min(len(kept), e - p) and kept[a] == int(verify[p + a].argmax()):
            a += 1
        steps.append((p, len(kept), a))
        p += min(a + 1, e - p)
    return steps


def greedy_completion(target, prompt: list[int], n_new: int) -> list[int]:
    """The target's own greedy continuation (transformers' cache, one token a step)."""
    from transformers import DynamicCache

    from mtp_observe.model.target import _cache_kwarg

    cache, x = DynamicCache(config=target.config), list(prompt)
    with torch.no_grad():
        logits = target(input_ids=torch.tensor(x)[None], use_cache=True, **{_cache_kwarg(target.model): cache}).logits
        while len(x) < len(prompt) + n_new:
            x.append(int(logits[0, -1].argmax()))
            logits = target(input_ids=torch.tensor(x[-1:])[None], use_cache=True,
                            **{_cache_kwarg(target.model): cache}).logits
    return x


@pytest.fixture(scope="module")
def greedy_run(tmp_path_factory):
    """The bundled (trained) model's own greedy completion of a demo prompt, replayed in float64 with a threshold."""
    from mtp_observe.model.loading import default_model_dir
    from mtp_observe.sessions.reading import read_sessions
    from mtp_observe.sessions.rendering import Renderer

    from .reference_head import ReferenceHead

    base = tmp_path_factory.mktemp("greedy")
    model_dir = default_model_dir()
    model = load_model(model_dir, dtype=torch.float64)
    head = ReferenceHead(model.head.named_weights(), model.head.geometry, model.head.embed_tokens, model.head.lm_head,
                         dtype=torch.float64)
    demo = sorted((Path(__file__).resolve().parents[1] / "sessions").glob("*.jsonl"))[0]
    request = Renderer.from_model_dir(model_dir).render(next(iter(read_sessions([demo])))).requests[0]
    prompt = request.input_ids[: request.spans[0].start]
    tokens = greedy_completion(model.target, prompt, 40)
    path = write_sessions(base / "own.jsonl", [{"id": "own", "prompt_token_ids": prompt,
                                                "completion_token_ids": tokens[len(prompt):]}])
    run = replay([path], model_dir, base / "run", ReplayOptions(k=3, device="cpu", dtype="float64", draft_p_min=(0.6,)))
    return model, head, tokens, len(prompt), run


@pytest.mark.slow  # about 2 minutes: a draft and a verify from scratch at every step of the loop
@pytest.mark.manual  # run by hand, out of .ci/run (its 60-minute budget)
@pytest.mark.parametrize("theta", [0.35, 0.6])
def test_the_stopped_walk_is_a_real_draft_and_verify_loop_with_llama_cpps_stop(greedy_run, theta):
    model, head, tokens, s, run_dir = greedy_run
    loop = stopping_speculative_decode(model.target, head, tokens, s, 3, theta)
    run = load_run(run_dir)
    counts = stopped_walks(run, (theta,)).total()
    assert 0 < sum(n for _, n, _ in loop) < 3 * len(loop)  # the stop fires, and drafts survive it
    assert counts.steps[0, 2] == len(loop)
    assert counts.accepted[0, 2] == sum(a for _, _, a in loop)
    assert (counts.hist[0, 2] * np.arange(4)).sum() == sum(n for _, n, _ in loop)
    assert counts.passes[0, 2] == sum(min(n + 1, 3) for _, n, _ in loop)


def test_the_stop_compares_the_heads_top_ten_softmax_where_the_other_probabilities_decide_otherwise():
    # One anchor, K = 2, the recorded tokens (7, 8) and both drafts right. Depth 1: the head's logits (5, 4, 3) and 997
    # more at 0: llama.cpp's p = 1 / (1 + e^-1 + e^-2 + 7 e^-5) = 0.645; the whole vocabulary's softmax 0.122; the
    # target's probability of the draft, say 0.9. At p_min 0.5 only the first drafts: L = 2, a step emits 3 tokens.
    logits = torch.zeros(2, 1000, dtype=torch.float64)
    logits[:, 7], logits[:, 1], logits[:, 2] = 5.0, 4.0, 3.0
    head_p = draft_confidence(logits)
    whole = torch.softmax(logits, dim=-1)[:, 7]
    assert head_p[0].item() == pytest.approx(0.645003, abs=1e-6) and whole[0].item() == pytest.approx(0.121640, abs=1e-6)
    for probability, drafts in ((head_p, 2), (whole, 0), (torch.tensor([0.9, 0.4]), 1)):  # right; before the sampler; target's
        L, passes = drafted_lengths(probability.numpy()[None, :], 0.5, 2)
        assert (int(L[0]), int(passes[0])) == (drafts, min(drafts + 1, 2)), probability


def test_comparing_the_wrong_probability_walks_another_decode(runs):
    run = load_run(runs["whatif"])
    rows = pd.read_parquet(runs["whatif"] / "positions.parquet")
    rows = rows[rows.head_precision.isna()].sort_values(KEY)
    theta = float(np.median(run.rows.confidence))
    right = stopped_walks(run, (theta,)).total()
    for wrong in (rows.draft_logprob, rows.target_logprob):  # the head's whole-vocabulary softmax; the target's
        other = dataclasses.replace(run, rows=dataclasses.replace(run.rows, confidence=np.exp(wrong.to_numpy(np.float64))))
        assert not np.array_equal(stopped_walks(other, (theta,)).total().hist, right.hist)
    assert (np.exp(rows.draft_logprob) < rows.draft_confidence).all()


@pytest.mark.parametrize("spec, engine", [(dict(family="deepseek_v3", layout="text", dtype="bfloat16"), "vllm"),
                                          (dict(family="glm4_moe", layout="text", dtype="bfloat16"), "sglang"),
                                          (dict(mtp_layers=2, dtype="bfloat16"), "vllm")],
                         ids=["deepseek_v3", "glm4_moe_sglang", "two_layers"])
def test_each_precision_rebuilds_a_head_of_the_served_heads_family_layers_and_reading(make_checkpoint, spec, engine):
    from mtp_observe.model.target import prefill_hidden

    model = load_model(make_checkpoint(**spec), head_engine=engine)
    head, g = model.head, model.info.geometry
    ids = torch.randint(0, g.vocab_size, (120,), generator=torch.Generator().manual_seed(3))
    hidden = prefill_hidden(model.target, ids, chunk_size=64)
    anchors = torch.tensor([1, 2, 30, 77, 118])
    depths = torch.full_like(anchors, 3)

    def drafts(h):
        return h.chain(h.row_pass(hidden[:-1], ids[1:], chunk_size=64), anchors, depths, confidence=True)

    served = drafts(head)
    recipes = precisions.head_recipes(model.info, ("bf16", "q6_k"))  # q6_k: the tiny rows fall back to Q8_0, F16
    for name, r in recipes.items():
        copy = precisions.head_at(head, r)
        assert type(copy) is type(head) and copy.reading == head.reading and len(copy.layers) == len(head.layers)
        assert set(copy.named_weights()) == set(head.named_weights()) == set(precisions.head_shapes(g))
        d = drafts(copy)
        assert bool((d.confidence > 0).all()) and bool((d.confidence <= 1).all())
        if name == "bf16":  # float32 copies of bf16 weights: the round trip is the identity, so are the drafts
            assert torch.equal(d.tokens, served.tokens) and torch.equal(d.confidence, served.confidence)
        else:
            assert not torch.equal(d.logprobs, served.logprobs)  # the GGUF round trips changed the head's numbers


def test_the_precision_rows_sit_beside_ngram_trees_and_the_stepwise_rule_and_leave_their_rows_unchanged(make_checkpoint,
                                                                                                      tmp_path):
    from mtp_observe.drafting.tree import parse_tree

    model = make_checkpoint(mtp_layers=2, dtype="bfloat16")  # two layers: the stepwise rule's rows too
    files = [sessions_file(tmp_path, 2)]
    both = dict(k=2, device="cpu", drafters=("mtp", "ngram"), trees=(parse_tree("2,2,3"),))
    plain = pd.read_parquet(replay(files, model, tmp_path / "plain", ReplayOptions(**both)) / "positions.parquet")
    run = replay(files, model, tmp_path / "w", ReplayOptions(**both, head_precisions=("bf16", "q6_k"), draft_p_min=(0.5,)))
    rows = pd.read_parquet(run / "positions.parquet")
    which = rows.head_precision.astype(object).where(rows.head_precision.notna(), "served")
    by = rows.groupby([rows.drafter.astype(str), which]).size().to_dict()
    n = len(plain) // 4  # mtp, mtp:stepwise, ngram, the tree: one block each at K = 2
    assert by == {("mtp", "bf16"): n, ("mtp", "q6_k"): n, ("mtp", "served"): n, ("mtp:stepwise", "served"): n,
                  ("ngram", "served"): n, ("tree:2,2,3", "served"): n}
    served = rows[rows.head_precision.isna()]
    assert served[served.drafter == "mtp"].draft_confidence.notna().all() and served[served.drafter != "mtp"].draft_confidence.isna().all()
    key = ["session_id", "request", "drafter", "draft_k", "pos", "depth", "tree_node"]
    a = plain.sort_values(key).reset_index(drop=True)
    b = served[plain.columns].sort_values(key).reset_index(drop=True)
    for column in a.columns:  # every other drafter's and variant's rows exactly as without the what-ifs
        x, y = a[column], b[column]
        if x.dtype.kind == "f" or y.dtype.kind == "f":
            assert np.array_equal(x.to_numpy(float, na_value=np.nan), y.to_numpy(float, na_value=np.nan), equal_nan=True), column
        else:
            assert (x.astype(str) == y.astype(str)).all(), column
    mtp_key = ["session_id", "request", "pos", "depth"]
    head = served[served.drafter == "mtp"].sort_values(mtp_key).draft_len.to_numpy()
    for p in ("bf16", "q6_k"):  # as the served head's: K, fewer where the turn ends first
        assert np.array_equal(rows[rows.head_precision == p].sort_values(mtp_key).draft_len.to_numpy(), head), p
    doc = report_json(read_and_summarize(run, replicates=50, seed=0).report)
    assert [p["precision"] for p in doc["head_precisions"]] == ["bf16", "q6_k"] and len(doc["trees"]) == 1
