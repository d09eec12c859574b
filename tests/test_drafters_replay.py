"""Every drafter on the same anchors, through replay and report: the rows, the run directory, the ranking."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from mtp_observe.drafting.drafters import NO_TOKEN, accepted_length, span_ends
from mtp_observe.drafting.drafters.hybrid import longer, score_threshold
from mtp_observe.drafting.drafters.ngram import NgramConfig, NgramDrafter
from mtp_observe.drafting.drafters.suffix import SuffixConfig, SuffixDecoding
from mtp_observe.model.loading import default_model_dir
from mtp_observe.report import load_run, read_and_summarize, report_json
from mtp_observe.report.metrics import simulate_decode
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay

from .test_drafters_ngram import _prose
from .test_replay import SESSION, write_sessions

ROOT = Path(__file__).resolve().parents[1]
DEMO = sorted((ROOT / "sessions").glob("*.jsonl"))
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")


def cli(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "mtp_observe", *map(str, args)], capture_output=True, text=True, **kwargs)


@pytest.fixture(scope="module")
def tokenizer_only(tmp_path_factory) -> Path:
    """The bundled model's tokenizer, chat template and generation config — and no config.json, no weights."""
    out = tmp_path_factory.mktemp("tokenizer-only")
    for name in TOKENIZER_FILES:
        if (default_model_dir() / name).is_file():
            shutil.copy(default_model_dir() / name, out / name)
    assert not list(out.glob("*.safetensors")) and not (out / "config.json").exists()
    return out


def requests_of(run: Path) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(session_id, tokens, spans [S, 2]) of every request, in input order, from requests.parquet."""
    table = pd.read_parquet(run / "requests.parquet")
    return [(r.session_id, np.asarray(r.input_ids, dtype=np.int32),
             np.array([(s["start"], s["end"]) for s in r.spans], dtype=np.int64).reshape(-1, 2))
            for r in table.itertuples()]


def drafter_rows(rows: pd.DataFrame, drafter: str, draft_k: int, session: str, request: int) -> pd.DataFrame:
    sel = (rows.drafter == drafter) & (rows.draft_k == draft_k) & (rows.session_id == session) & (rows.request == request)
    return rows[sel].sort_values(["pos", "depth"])


def expected_rows(tokens: np.ndarray, spans: np.ndarray, drafts: np.ndarray, k: int) -> list[tuple[int, int, int, bool, bool]]:
    """(pos, depth, draft_token, match, accepted) at every evaluable depth of every anchor, written out plainly."""
    out = []
    a = 0
    for s, e in spans:
        for p in range(max(s, 1), e):
            alive = True
            for depth in range(1, min(k, e - p) + 1):
                d = int(drafts[a, depth - 1])
                match = d == int(tokens[p + depth])
                alive = alive and match
                out.append((p, depth, d, match, alive))
            a += 1
    return out


# --- a model-free replay ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_free_run(tokenizer_only, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("model-free") / "run"
    return replay(DEMO, tokenizer_only, out, ReplayOptions(k=3, drafters=("ngram", "suffix")))


def test_a_model_free_replay_needs_no_weights_and_writes_no_target_columns(model_free_run):
    """A tokenizer-only directory (no config.json, no safetensors) is enough: nothing of the target is read."""
    manifest = json.loads((model_free_run / "run.json").read_text())
    assert manifest["status"] == "complete" and manifest["target_ran"] is False
    assert list(manifest["drafters"]) == ["ngram", "suffix"]
    assert manifest["drafters"]["ngram"]["draft_k"] == [3] and manifest["drafters"]["suffix"]["draft_k"] == [1, 2, 3]
    assert manifest["drafters"]["suffix"]["max_tree_depth"] == 24 and manifest["drafters"]["ngram"]["prompt_lookup_min"] == 5
    assert manifest["sampling"] == {} and manifest["model"]["weights_fingerprint"] is None
    assert manifest["model"]["roofline"] is None and manifest["device"] == "cpu"
    assert set(manifest["timing"]["drafting"]) == {"ngram", "suffix"}
    positions = pq.read_table(model_free_run / "positions.parquet")
    names = positions.schema.names
    assert "drafter" in names and "draft_k" in names
    assert not {"target_token", "target_logprob", "actual_logprob"} & set(names)
    assert not [n for n in names if n.startswith("p_accept_")]
    rows = positions.to_pandas()
    assert rows.draft_logprob.isna().all()
    assert sorted(rows.groupby(["drafter", "draft_k"], observed=True).size().index.tolist()) == [
        ("ngram", 3), ("suffix", 1), ("suffix", 2), ("suffix", 3)]
    assert manifest["counts"]["rows"] == len(rows) and manifest["counts"]["anchors"] == int(
        ((rows.drafter == "ngram") & (rows.depth == 1)).sum())


def test_model_free_rows_are_the_drafters_own_proposals_in_input_order(model_free_run):
    """ngram rows equal NgramDrafter's proposals; suffix rows at draft_k K' equal SuffixDecoding's draft at K'
    (by_k) with the run's requests fed in input order; match and accepted as ACCEPTANCE.md defines them."""
    rows = pd.read_parquet(model_free_run / "positions.parquet")
    ngram, suffix = NgramDrafter(), SuffixDecoding()
    checked = not_a_prefix = 0
    table = pd.read_parquet(model_free_run / "requests.parquet")
    for r, (session, tokens, spans) in zip(table.itertuples(), requests_of(model_free_run)):
        request = int(r.request)
        n = ngram.propose(tokens, spans, 3)
        got = drafter_rows(rows, "ngram", 3, session, request)
        assert list(zip(got.pos, got.depth, got.draft_token, got.match, got.accepted)) == expected_rows(tokens, spans, n.tokens, 3)
        assert (got.draft_len == 3).all()  # V2's n-gram always drafts K
        s = suffix.propose(tokens, spans, 3, by_k=True)
        for kk in (1, 2, 3):
            drafts = s.tokens_by_k[:, kk - 1, :kk]
            got = drafter_rows(rows, "suffix", kk, session, request)
            assert list(zip(got.pos, got.depth, got.draft_token, got.match, got.accepted)) == expected_rows(tokens, spans, drafts, kk)
            # draft_len: the tokens the anchor's draft holds (past the end of the turn too), on each of its rows
            lengths = (drafts != NO_TOKEN).sum(axis=1)
            first = got[got.depth == 1]
            assert first.draft_len.tolist() == lengths.tolist()
            not_a_prefix += int((drafts != s.tokens[:, :kk]).any(axis=1).sum())
        checked += 1
    assert checked == len(table) > 5
    assert not_a_prefix > 0  # the per-K rows hold drafts the Kmax draft cut at K' would not


def test_suffix_tau_sim_at_every_k_walks_the_draft_made_for_that_k(model_free_run):
    """The report's τ_sim(K) for suffix is the simulated decode of the draft made for K — not of the Kmax
    draft cut at K, which gives a different number on these sessions."""
    suffix = SuffixDecoding()
    exact, cut, emitted = np.zeros(3), np.zeros(3), 0
    for _, tokens, spans in requests_of(model_free_run):
        s = suffix.propose(tokens, spans, 3, by_k=True)
        anchor = s.anchors
        ends = span_ends(spans)
        span_len = spans[:, 1] - np.maximum(spans[:, 0], 1)
        emitted += int(span_len.sum())
        for kk in (1, 2, 3):
            exact[kk - 1] += simulate_decode(accepted_length(tokens, anchor, ends, s.tokens_by_k[:, kk - 1, :kk]), span_len, kk).sum()
            cut[kk - 1] += simulate_decode(accepted_length(tokens, anchor, ends, s.tokens[:, :kk]), span_len, kk).sum()
    reading = read_and_summarize(model_free_run, drafter="suffix", replicates=50)
    assert reading.report.drafter == "suffix"
    np.testing.assert_allclose(reading.report.overall.value.tau_sim, emitted / exact)
    assert not np.allclose(emitted / exact, emitted / cut)
    assert load_run(model_free_run, "suffix").accepted_len_by_k.shape[1] == 3
    assert load_run(model_free_run, "ngram").accepted_len_by_k is None  # its drafts at K are the Kmax draft's first K


def test_the_report_of_a_model_free_run_says_what_it_cannot_compute_and_does_not_pretend(model_free_run, tmp_path):
    r = cli("report", model_free_run, "--format", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["run"]["target_ran"] is False and data["run"]["drafter"] == "ngram"  # no mtp: the first drafter
    assert data["verdict"]["status"] == "UNRELIABLE" and "no target ran" in data["verdict"]["reason"]
    assert "not what serving would accept" in data["verdict"]["reason"]
    assert data["recorded_with"]["name"] is None and data["recorded_with"]["candidates"] == []
    assert data["on_policy"]["rate"] is None and data["overall"]["value"]["tau_profile"] == {}
    assert any("no p_accept" in n and "no recording-sampler check" in n for n in data["notes"])
    drafters = data["drafters"]
    assert drafters["names"] == ["ngram", "suffix"] and drafters["judged"] == "ngram"
    assert {d: drafters["by_drafter"][d]["cost"]["c"] for d in ("ngram", "suffix")} == {"ngram": 0.0, "suffix": 0.0}
    gated = cli("report", model_free_run, "--drafter", "suffix", "--gate", "speedup>=1.1", "--format", "json")
    assert gated.returncode == 1 and json.loads(gated.stdout)["verdict"]["status"] == "UNRELIABLE"  # never GO unchecked
    missing = cli("report", model_free_run, "--drafter", "mtp")
    assert missing.returncode == 2 and missing.stderr.strip() == (
        "error: --drafter mtp: the run has no rows of it; it has ngram, suffix")


def test_token_level_input_replays_model_free_through_a_tokenizer_only_directory(tokenizer_only, tmp_path):
    """Token-level records (prompt and completion ids) with ngram and suffix only: no weights read, and the rows
    are the drafters' proposals over exactly those ids — a completion that repeats its prompt is drafted whole."""
    rng = np.random.default_rng(3)
    base = [int(x) for x in rng.integers(100, 2000, size=200)]
    records = [{"id": "copy", "prompt_token_ids": base, "completion_token_ids": base[:120]},
               {"id": "fresh", "prompt_token_ids": base, "completion_token_ids": [int(x) for x in rng.integers(2000, 4000, size=120)]}]
    path = tmp_path / "tokens.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    run = replay([path], tokenizer_only, tmp_path / "run", ReplayOptions(k=4, drafters=("ngram", "suffix")))
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["target_ran"] is False and manifest["model"]["weights_fingerprint"] is None
    rows = pd.read_parquet(run / "positions.parquet")
    ngram = NgramDrafter()
    for session, tokens, spans in requests_of(run):
        assert tokens.tolist() == dict((r["id"], r["prompt_token_ids"] + r["completion_token_ids"]) for r in records)[session][:len(tokens)]
        got = drafter_rows(rows, "ngram", 4, session, 0)
        assert list(zip(got.pos, got.depth, got.draft_token, got.match, got.accepted)) == expected_rows(
            tokens, spans, ngram.propose(tokens, spans, 4).tokens, 4)
    tau = {s.name: s.value.tau_sim[3] for s in read_and_summarize(run, drafter="ngram", replicates=20).report.sessions}
    assert tau["copy"] > 4.0 and tau["fresh"] < 1.05, tau  # K + 1 = 5, less the anchors whose last 5 tokens straddle the seam


# --- the acceptance point: through replay and report ---------------------------------------------


def test_verbatim_repeats_give_ngram_tau_sim_near_k_plus_1_and_fresh_prose_near_1_through_replay_and_report(tmp_path):
    """Assistant turns that copy the user's passage, and turns of new made-up prose: replay --drafters ngram
    (no weights) and report, per session."""
    rng = random.Random(7)
    k = 4

    def session(name, reply_of):
        messages = [{"role": "system", "content": "You are a careful assistant."}]
        for _ in range(3):
            passage = _prose(rng, 120)
            messages += [{"role": "user", "content": f"Please repeat exactly:\n{passage}"},
                         {"role": "assistant", "content": reply_of(passage)}]
        return {"id": name, "messages": messages}

    path = write_sessions(tmp_path / "s.jsonl", [session("repeats", lambda passage: passage),
                                                 session("prose", lambda passage: _prose(rng, 120))])
    r = cli("replay", path, "--drafters", "ngram", "--k", k, "--out", tmp_path / "run")
    assert r.returncode == 0, r.stderr
    r = cli("report", tmp_path / "run", "--format", "json")
    assert r.returncode == 0, r.stderr
    by_session = {s["name"]: s["value"]["tau_sim"][k - 1] for s in json.loads(r.stdout)["slices"]["session"]}
    assert by_session["repeats"] > 0.9 * (k + 1), by_session
    assert by_session["prose"] < 1.05, by_session


# --- resume and data-parallel: the global tree sees every session in input order -----------------


def _identical_sessions(tmp_path: Path, n: int) -> Path:
    return write_sessions(tmp_path / "s.jsonl", [dict(SESSION, id=f"s{i}") for i in range(n)])


def test_a_resumed_model_free_run_equals_an_uninterrupted_one_for_suffix_rows(tokenizer_only, tmp_path):
    """The sessions a resumed run keeps reach suffix decoding's global tree (read back from their parts), so the
    sessions it drafts afresh get the drafts of an uninterrupted run, byte for byte. Control: drafted without the
    earlier sessions, the later ones' suffix rows differ (the global tree is what carries them)."""
    path = _identical_sessions(tmp_path, 5)
    opts = ReplayOptions(k=3, drafters=("suffix", "ngram"), part_sessions=1)  # a part per session, to cut three of them
    whole = replay([path], tokenizer_only, tmp_path / "whole", opts)
    cut = tmp_path / "cut"
    shutil.copytree(whole, cut)
    for table in ("positions.parquet", "requests.parquet"):
        for i in (2, 3, 4):
            (cut / table / f"part-{i:08d}.parquet").unlink()
    manifest = json.loads((cut / "run.json").read_text())
    manifest.update(status="running", finished=None)
    (cut / "run.json").write_text(json.dumps(manifest))
    replay([path], tokenizer_only, cut, ReplayOptions(**{**opts.__dict__, "resume": True}))
    for table in ("positions.parquet", "requests.parquet"):
        for part in sorted((whole / table).iterdir()):
            assert part.read_bytes() == (cut / table / part.name).read_bytes(), part.name
    alone = write_sessions(tmp_path / "late.jsonl", [dict(SESSION, id=f"s{i}") for i in (2, 3, 4)])
    late = pd.read_parquet(replay([alone], tokenizer_only, tmp_path / "late", opts) / "positions.parquet")
    rows = pd.read_parquet(whole / "positions.parquet")
    mine = rows[(rows.session_id == "s2") & (rows.drafter == "suffix")].reset_index(drop=True)
    theirs = late[(late.session_id == "s2") & (late.drafter == "suffix")].reset_index(drop=True)
    assert len(mine) == len(theirs) and (mine.draft_token != theirs.draft_token).any()


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_torchrun_with_two_processes_gives_the_same_model_free_rows_as_one(tokenizer_only, tmp_path):
    """Each rank feeds the sessions the other one replays to suffix decoding's global tree, in input order."""
    import os

    path = _identical_sessions(tmp_path, 5)
    one = replay([path], tokenizer_only, tmp_path / "one", ReplayOptions(k=2, drafters=("ngram", "suffix")))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "-m", "mtp_observe", "replay", str(path), "--model", str(tokenizer_only), "--k", "2",
                        "--drafters", "ngram,suffix", "--out", str(tmp_path / "two")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    keys = ["session_id", "request", "drafter", "draft_k", "pos", "depth"]
    a = pd.read_parquet(one / "positions.parquet").sort_values(keys).reset_index(drop=True)
    b = pd.read_parquet(tmp_path / "two" / "positions.parquet").sort_values(keys).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)
    assert json.loads((tmp_path / "two" / "run.json").read_text())["counts"] == json.loads((one / "run.json").read_text())["counts"]


# --- with the target: mtp beside the others --------------------------------------------------------


ALL = ("mtp", "ngram", "suffix", "hybrid", "hybrid_longer")


@pytest.fixture(scope="module")
def every_drafter(tiny_checkpoint, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("every-drafter")
    path = write_sessions(tmp / "s.jsonl", [SESSION, dict(SESSION, id="two"), dict(SESSION, id="three")])
    return replay([path], tiny_checkpoint, tmp / "run", ReplayOptions(k=3, device="cpu", drafters=ALL,
                                                                     ngram=NgramConfig(1, 3)))


def test_the_heads_rows_beside_other_drafters_equal_an_mtp_only_run(every_drafter, tiny_checkpoint, tmp_path):
    path = write_sessions(tmp_path / "s.jsonl", [SESSION, dict(SESSION, id="two"), dict(SESSION, id="three")])
    alone = pd.read_parquet(replay([path], tiny_checkpoint, tmp_path / "mtp", ReplayOptions(k=3, device="cpu")) / "positions.parquet")
    assert "drafter" not in alone.columns  # an mtp-only run is written as before
    rows = pd.read_parquet(every_drafter / "positions.parquet")
    mtp = rows[rows.drafter == "mtp"].drop(columns=["drafter", "draft_k", "draft_len"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(mtp, alone)


def test_the_target_scores_every_drafters_drafts_and_a_missing_draft_is_never_gathered(every_drafter, tiny_model):
    """target_logprob of a model-free draft is the target's log-softmax at that token; where nothing was proposed
    (draft_token -1) it is NaN and every p_accept 0 — a gather at -1 would have read the last vocabulary entry."""
    rows = pd.read_parquet(every_drafter / "positions.parquet")
    requests = pd.read_parquet(every_drafter / "requests.parquet")
    checked = missing = 0
    for r in requests.itertuples():
        ids = torch.tensor(list(r.input_ids))
        with torch.no_grad():
            logprobs = torch.log_softmax(tiny_model.target(input_ids=ids[None]).logits[0].float(), -1)
        mine = rows[(rows.session_id == r.session_id) & (rows.request == r.request) & (rows.drafter == "suffix")]
        for row in mine.itertuples():
            at = row.pos + row.depth - 1
            assert row.target_token == int(logprobs[at].argmax())
            if row.draft_token < 0:
                assert np.isnan(row.target_logprob) and row.p_accept_greedy == 0 and row.p_accept_thinking_coding == 0
                assert not row.match
                missing += 1
            else:
                assert abs(row.target_logprob - float(logprobs[at, row.draft_token])) < 1e-4
                assert row.p_accept_greedy == float(row.draft_token == int(logprobs[at].argmax()))
                checked += 1
    assert checked > 20 and missing > 20
    assert rows[rows.drafter.isin(["ngram", "suffix"])].draft_logprob.isna().all()


def test_the_hybrids_rows_follow_arctics_policy_and_the_longer_proposal(every_drafter):
    """hybrid at K': suffix decoding's draft (speculating up to its tree depth) where its score >= K' and it drafts,
    else the head's first K'; hybrid_longer: the longer of suffix's draft at K' and the head's. draft_logprob is
    the head's where the head's draft was taken, NaN elsewhere."""
    rows = pd.read_parquet(every_drafter / "positions.parquet")
    deep, by_k = SuffixDecoding(SuffixConfig(max_spec_tokens=24)), SuffixDecoding()
    took_suffix = took_head = 0
    requests = pd.read_parquet(every_drafter / "requests.parquet")
    for r, (session, tokens, spans) in zip(requests.itertuples(), requests_of(every_drafter)):
        a, b = deep.propose(tokens, spans, 3), by_k.propose(tokens, spans, 3, by_k=True)
        head = drafter_rows(rows, "mtp", 3, session, int(r.request))
        A = len(a.anchors)
        mtp = np.full((A, 3), -1, dtype=np.int32)
        index = {p: i for i, p in enumerate(a.anchors.tolist())}
        for row in head.itertuples():
            mtp[index[row.pos], row.depth - 1] = row.draft_token
        head_lp = {(row.pos, row.depth): row.draft_logprob for row in head.itertuples()}
        for kk in (1, 2, 3):
            cut = np.where(np.arange(3) < kk, a.tokens, -1)[:, :kk]
            for name, combined in (("hybrid", score_threshold(cut, a.scores, mtp[:, :kk], kk)),
                                   ("hybrid_longer", longer(b.tokens_by_k[:, kk - 1, :kk], mtp[:, :kk]))):
                got = drafter_rows(rows, name, kk, session, int(r.request))
                assert list(zip(got.pos, got.depth, got.draft_token)) == [
                    (p, d, t) for p, d, t, _, _ in expected_rows(tokens, spans, combined.tokens, kk)]
                for row in got.itertuples():
                    if combined.primary[index[row.pos]]:
                        assert np.isnan(row.draft_logprob)
                    else:
                        assert row.draft_logprob == head_lp[(row.pos, row.depth)]
                took_suffix += int(combined.primary.sum())
                took_head += int((~combined.primary).sum())
    assert took_suffix > 0 and took_head > 0


def test_the_report_ranks_every_drafter_with_its_own_cost_and_judges_the_one_asked(every_drafter, tmp_path):
    r = cli("report", every_drafter, "--format", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    drafters = data["drafters"]
    assert drafters["names"] == list(ALL) and drafters["judged"] == "mtp" and data["run"]["drafter"] == "mtp"
    assert set(drafters["by_drafter"]["suffix"]) == {"judged", "per_k", "cost", "best", "overall", "slices"}
    assert set(drafters["by_drafter"]["suffix"]["slices"]) == {"segment", "context"}
    assert set(drafters["ranking"][0]) == {"drafter", "k", "speedup", "speedup_lo", "speedup_hi", "tau_sim", "behind",
                                           "behind_lo", "behind_hi"}
    c = {name: d["cost"]["c"] for name, d in drafters["by_drafter"].items()}
    head = data["cost"]["c"]
    assert head > 0 and c == {"mtp": head, "ngram": 0.0, "suffix": 0.0, "hybrid": head, "hybrid_longer": head}
    assert {n: d["per_k"] for n, d in drafters["by_drafter"].items()} == {
        "mtp": False, "ngram": False, "suffix": True, "hybrid": True, "hybrid_longer": True}
    speedups = [x["speedup"] for x in drafters["ranking"]]
    assert speedups == sorted(speedups, reverse=True) and drafters["ranking"][0]["behind"] == 0
    for x in drafters["ranking"]:  # each at its own best K, with its own cost
        d = drafters["by_drafter"][x["drafter"]]
        assert x["k"] == d["best"]["k"] and x["speedup"] == pytest.approx(
            d["overall"]["value"]["tau_sim"][x["k"] - 1]
            / (1 + x["k"] * d["cost"]["c"] + d["cost"]["verify_extra"][x["k"] - 1]))
    verify = {name: d["cost"]["verify_extra"] for name, d in drafters["by_drafter"].items()}
    assert all(v == verify["mtp"] for v in verify.values())  # verifying K+1 tokens costs the same whoever drafted
    assert drafters["best_by_k"] == [max(ALL, key=lambda n: drafters["by_drafter"][n]["overall"]["value"]["speedup"][k])
                                     for k in range(3)]
    judged = cli("report", every_drafter, "--drafter", "suffix", "--format", "json")
    other = json.loads(judged.stdout)
    assert other["drafters"]["judged"] == "suffix" and other["verdict"]["value"] == pytest.approx(
        drafters["by_drafter"]["suffix"]["overall"]["value"]["speedup"][other["verdict"]["k"] - 1])
    assert other["recorded_with"]["name"] == data["recorded_with"]["name"]  # the same traffic, the same check
    md = cli("report", every_drafter, "--format", "markdown", "--plot", tmp_path / "p.png", "--details")
    assert md.returncode == 0 and "which drafter, at which K, on this traffic" in md.stdout
    assert "speedup by K and drafter" in md.stdout and "drafters by context length" in md.stdout
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_report_json_of_an_mtp_only_run_has_one_drafter_and_no_drafter_tables(tiny_checkpoint, tmp_path):
    path = write_sessions(tmp_path / "s.jsonl", [SESSION, dict(SESSION, id="two")])
    run = replay([path], tiny_checkpoint, tmp_path / "run", ReplayOptions(k=2, device="cpu"))
    assert load_run(run).drafters == ("mtp",)
    reading = read_and_summarize(run, replicates=20)
    data = report_json(reading.report)
    assert data["drafters"]["names"] == ["mtp"] and data["drafters"]["ranking"][0]["drafter"] == "mtp"
    from mtp_observe.report.presentation import markdown

    assert "which drafter" not in markdown(reading.report)


def test_drafter_options_are_checked_in_one_line(tmp_path):
    path = write_sessions(tmp_path / "s.jsonl", [SESSION])
    for args, needle in ((["--drafters", "mtp,eagle"], "unknown drafter 'eagle'"),
                         (["--drafters", "ngram,ngram"], "named twice"),
                         (["--drafters", "ngram", "--ngram", "4,2"], "prompt_lookup_min=4 must be <= prompt_lookup_max=2"),
                         (["--drafters", "ngram", "--ngram", "two"], "--ngram two: expected MIN,MAX"),
                         (["--drafters", "suffix", "--suffix-min-token-prob", "2"], "min_token_prob=2.0 must be in [0, 1]"),
                         (["--drafters", "ngram", "--sampling", "x=1,1,0"], "add mtp to --drafters")):
        r = cli("replay", path, "--out", tmp_path / "run", *args)
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


def test_export_writes_the_winning_drafters_config_and_says_which(every_drafter):
    report = json.loads(cli("report", every_drafter, "--format", "json").stdout)
    ranking = [r["drafter"] for r in report["drafters"]["ranking"]]
    served = next(name for name in ranking if name in ("mtp", "ngram", "suffix"))
    status = json.loads(cli("report", every_drafter, "--drafter", served, "--format", "json").stdout)["verdict"]["status"]
    refused = cli("export", every_drafter, "--engine", "vllm")  # export follows the verdict: a tiny random model's is no GO
    assert status != "GO" and refused.returncode == 1 and refused.stderr.startswith(f"not exported: {status}")
    exported = cli("export", every_drafter, "--engine", "vllm", "--force")
    assert exported.returncode == 0 and "not recommended" in exported.stderr, exported.stderr
    config = json.loads(exported.stdout)["speculative_config"]
    assert config["method"] == served and config["num_speculative_tokens"] == report["drafters"]["by_drafter"][served]["best"]["k"]
    assert exported.stderr.startswith(f"exporting {served}: the best drafter of the run's ranking")
    assert (f"({ranking[0]} ranks first)" in exported.stderr) == (served != ranking[0])
    profile = cli("export", every_drafter, "--engine", "speculation-profile", "--force")  # any drafter: the winner itself
    assert profile.returncode == 0 and json.loads(profile.stdout)["method"] == ranking[0], profile.stderr
    chosen = cli("export", every_drafter, "--engine", "vllm", "--drafter", "mtp", "--force")
    assert chosen.returncode == 0 and json.loads(chosen.stdout)["speculative_config"]["method"] == "mtp"
    assert "exporting" not in chosen.stderr
