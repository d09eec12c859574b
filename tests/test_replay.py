"""The replay engine: rows equal a plain recomputation and a real draft-and-verify loop; the run directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from mtp_observe.model.target import BUILTIN_PROFILES, SamplingProfile, Turns, reduce_logits, sampler_distribution
from mtp_observe.run.options import ReplayOptions
from mtp_observe.run.pipeline import replay
from mtp_observe.run.schema import positions_schema, requests_schema
from mtp_observe.run.tables import SCHEMA_VERSION

from .conftest import interruptible
from .reference_head import ReferenceHead

SESSION = {
    "id": "demo",
    "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}],
    "messages": [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "Find the order status for order 42, please."},
        {"role": "assistant", "reasoning_content": "Look it up.", "content": "Checking.",
         "tool_calls": [{"id": "a", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": \"order 42\"}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "{\"status\": \"shipped\"}"},
        {"role": "assistant", "content": "Order 42 has shipped."},
        {"role": "user", "content": "Thanks. And order 43?"},
        {"role": "assistant", "reasoning_content": "Again.", "content": "Let me look.",
         "tool_calls": [{"id": "b", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": \"order 43\"}"}}]},
        {"role": "tool", "tool_call_id": "b", "content": "{\"status\": \"pending\"}"},
        {"role": "assistant", "content": "Order 43 is pending."},
    ],
}


def write_sessions(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def run_cli(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "mtp_observe", *map(str, args)], capture_output=True, text=True, **kwargs)


# --- the rows, by value -----------------------------------------------------------------------


def test_every_row_equals_a_plain_recomputation_from_scratch(tiny_checkpoint, tiny_model, tmp_path):
    """Anchors, depths, drafts, target argmax/log-probs, match and accepted, recomputed one anchor at a time."""
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    run = replay([sessions], tiny_checkpoint, tmp_path / "run", ReplayOptions(k=3, device="cpu"))
    rows = pd.read_parquet(run / "positions.parquet")
    requests = pd.read_parquet(run / "requests.parquet")
    head = tiny_model.head
    ref = ReferenceHead(head.named_weights(), head.geometry, head.embed_tokens, head.lm_head)
    checked = 0
    for _, req in requests.iterrows():
        ids = torch.tensor(list(req.input_ids))
        with torch.no_grad():
            out = tiny_model.target(input_ids=ids[None])
            hidden = tiny_model.target.model(input_ids=ids[None]).last_hidden_state[0]
        logprobs = torch.log_softmax(out.logits[0].float(), -1)
        got = rows[rows.request == req.request].set_index(["pos", "depth"])
        expected_keys = []
        for span in req.spans:
            s, e = int(span["start"]), int(span["end"])
            for p in range(s, e):
                drafts, _ = ref.draft(hidden, ids, p, min(3, e - p))
                alive = True
                for k in range(1, min(3, e - p) + 1):
                    expected_keys.append((p, k))
                    row = got.loc[(p, k)]
                    d, x = drafts[k - 1], int(ids[p + k])
                    alive = alive and d == x
                    assert row.turn == span["turn"]
                    assert row.draft_token == d and row.actual_token == x
                    assert row.target_token == int(out.logits[0, p + k - 1].argmax())
                    assert row.match == (d == x) and row.accepted == alive
                    assert abs(row.target_logprob - float(logprobs[p + k - 1, d])) < 1e-4
                    assert abs(row.actual_logprob - float(logprobs[p + k - 1, x])) < 1e-4
                    checked += 1
        assert sorted(got.index) == sorted(expected_keys)  # exactly the evaluable (anchor, depth) pairs
    assert checked == len(rows) > 100


def test_the_sampler_follows_vllm_top_k_then_top_p_on_a_worked_example():
    # probabilities 0.5, 0.3, 0.15, 0.05 (plus a tail cut by top_k=4)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05, 1e-9]]))

    def probs(profile):
        return sampler_distribution(logits, profile).dense(5)[0]

    assert torch.allclose(probs(SamplingProfile("x", 1.0, top_p=0.8, top_k=4)), torch.tensor([0.625, 0.375, 0.0, 0.0, 0.0]), atol=1e-6)
    assert torch.allclose(probs(SamplingProfile("x", 1.0, top_p=1.0, top_k=2)), torch.tensor([0.625, 0.375, 0.0, 0.0, 0.0]), atol=1e-6)
    assert torch.allclose(probs(SamplingProfile("x", 1.0, top_p=1.0, top_k=0)), torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0]), atol=1e-6)
    assert probs(SamplingProfile("x", 0.0)).tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_reduce_logits_equals_vllms_sampler_on_every_profile_and_chunking(tiny_model):
    from .test_sampler import vllm_sampler

    gen = torch.Generator().manual_seed(3)
    n = 60
    hidden = torch.randn(n, tiny_model.info.geometry.hidden_size, generator=gen) * 3
    W = tiny_model.target.lm_head.weight
    ids = torch.randint(0, W.shape[0], (n,), generator=gen)
    ids[20:40] = ids[20:30].repeat(2)  # repeated tokens inside a turn: the penalties bite
    turns = Turns(ids, torch.tensor([12, 45]), torch.tensor([40, 58]))  # two spans [12, 40], [45, 58]
    positions = torch.cat([torch.randint(12, 40, (80,), generator=gen), torch.randint(45, 58, (40,), generator=gen)])
    logits = (hidden @ W.T).float()
    drafts = torch.randint(0, W.shape[0], (120,), generator=gen)
    drafts[::3] = logits.argmax(-1)[positions[::3]]  # some drafts are the argmax: non-zero probabilities
    actuals = torch.randint(0, W.shape[0], (120,), generator=gen)
    # "narrow" takes its top 5 from the ranking shared with the top-20 profiles; "copy" equals thinking_coding
    profiles = BUILTIN_PROFILES + (SamplingProfile("full", 1.3, 0.9, 0), SamplingProfile("narrow", 0.9, 0.7, 5),
                                   SamplingProfile("rep", 0.8, 0.9, 30, repetition_penalty=1.3, frequency_penalty=0.4),
                                   SamplingProfile("copy", 0.6, 0.95, 20))
    small = reduce_logits(W, hidden, positions, drafts, actuals, profiles, budget=W.shape[0] * 7, turns=turns)  # 7 rows a chunk
    whole = reduce_logits(W, hidden, positions, drafts, actuals, profiles, turns=turns)
    lp = torch.log_softmax(logits, -1)
    start = torch.where(positions < 45, 12, 45)
    for red in (small, whole):
        assert torch.equal(red.target_token, logits.argmax(-1)[positions])
        assert torch.allclose(red.target_logprob, lp[positions, drafts], atol=1e-5)
        assert torch.allclose(red.actual_logprob, lp[positions, actuals], atol=1e-5)
        for prof in profiles:
            want = torch.stack([vllm_sampler(logits[q], prof, ids[:s].tolist(), ids[s : q + 1].tolist())[d]
                                for q, s, d in zip(positions.tolist(), start.tolist(), drafts.tolist())]).float()
            assert torch.allclose(red.p_accept[prof.name], want, atol=1e-5), prof.name
        assert red.fit_tokens.tolist() == [40 - 12 + 1, 58 - 45 + 1]
        for prof in profiles:
            for a, b in zip(vars(red.fit[prof.name]).values(), vars(whole.fit[prof.name]).values()):
                assert torch.allclose(a.double(), b.double(), atol=1e-6), prof.name
    assert float(whole.p_accept["thinking_coding"].max()) > 0.1
    assert torch.equal(whole.p_accept["copy"], whole.p_accept["thinking_coding"])


# --- equivalences -----------------------------------------------------------------------------


def test_a_turn_gives_the_same_rows_in_a_merged_request_and_scored_alone(tiny_checkpoint, tmp_path):
    full = write_sessions(tmp_path / "full.jsonl", [SESSION])
    alone = write_sessions(tmp_path / "alone.jsonl", [dict(SESSION, id="alone", messages=SESSION["messages"][:5])])
    a = pd.read_parquet(replay([full], tiny_checkpoint, tmp_path / "a", ReplayOptions(k=3, device="cpu")) / "positions.parquet")
    b = pd.read_parquet(replay([alone], tiny_checkpoint, tmp_path / "b", ReplayOptions(k=3, device="cpu")) / "positions.parquet")
    requests = pd.read_parquet(tmp_path / "a" / "requests.parquet")
    assert [len(s) for s in requests.spans] == [2, 2]  # two requests of two turns each
    cols = [c for c in a.columns if c not in ("session_id",)]
    turn4_merged = a[a.turn == 4][cols].reset_index(drop=True)
    turn4_alone = b[b.turn == 4][cols].reset_index(drop=True)
    assert len(turn4_merged) > 0
    pd.testing.assert_frame_equal(turn4_merged, turn4_alone)


def test_the_files_have_exactly_the_contract_columns_and_types(tiny_checkpoint, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION, dict(SESSION, id="two")])
    run = replay([sessions], tiny_checkpoint, tmp_path / "run",
                 ReplayOptions(k=2, device="cpu", profiles=BUILTIN_PROFILES + (SamplingProfile("hot", 1.2, 0.9, 50),)))
    positions = pq.read_table(run / "positions.parquet")
    requests = pq.read_table(run / "requests.parquet")
    names = [p.name for p in BUILTIN_PROFILES] + ["hot", "recorded"]
    # version 5: a replay with the target carries accepted_past_end (the drafts an engine counts past the end of turn)
    assert positions.schema.remove_metadata() == positions_schema(names, past_end=True)
    assert requests.schema.remove_metadata() == requests_schema(names)
    assert positions.schema.field("segment").type == pa.dictionary(pa.int8(), pa.string())
    df = positions.to_pandas()
    assert df.equals(df.sort_values(["request", "pos", "depth"], kind="stable").sort_index())  # within a session
    assert list(dict.fromkeys(df.session_id)) == ["demo", "two"]  # input order
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["schema_version"] == SCHEMA_VERSION == 6 and manifest["status"] == "complete"
    assert (manifest["trees"], manifest["layer_rules"]) == ([], [])  # version 3: no --tree, a one-layer head
    for key in ("tool", "created", "finished", "model", "tokenizer_sha256", "k", "dtype", "device", "sampling",
                "recorded_with", "inputs", "options", "counts", "versions", "errors", "rendering", "trees", "layer_rules"):
        assert key in manifest, key
    assert manifest["model"]["max_position_embeddings"] == 262144 and manifest["model"]["rope_scaling"] is None
    assert manifest["sampling"]["recorded"]["per_session"] is True
    assert manifest["counts"]["max_request_tokens"] == int(requests.column("n_tokens").to_numpy().max())
    fit = requests.column("fit").to_pylist()
    assert [len(f) for f in fit] == [len(s) for s in requests.column("spans").to_pylist()]
    assert all(f["tokens"] == sp["end"] - sp["start"] + 1 for fs, sps in zip(fit, requests.column("spans").to_pylist())
               for f, sp in zip(fs, sps))
    assert {r["source"] for r in requests.column("recorded_sampling").to_pylist()} == {"fallback"}
    assert manifest["model"]["config_sha256"] and len(manifest["model"]["head_tensors"]) == 15
    assert manifest["inputs"][0]["sessions"] == 2 and len(manifest["inputs"][0]["sha256"]) == 64
    assert manifest["counts"]["rows"] == len(df) and manifest["counts"]["sessions_ok"] == 2
    assert manifest["counts"]["anchors"] == int((df.depth == 1).sum())
    assert set(manifest["sampling"]) == set(names)


def test_two_runs_of_the_same_input_give_identical_parquet(tiny_checkpoint, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION, dict(SESSION, id="two")])
    a = replay([sessions], tiny_checkpoint, tmp_path / "a", ReplayOptions(k=2, device="cpu"))
    b = replay([sessions], tiny_checkpoint, tmp_path / "b", ReplayOptions(k=2, device="cpu"))
    for table in ("positions.parquet", "requests.parquet"):
        assert pq.read_table(a / table).equals(pq.read_table(b / table))
        for part in sorted((a / table).iterdir()):
            assert part.read_bytes() == (b / table / part.name).read_bytes()


def test_a_run_killed_mid_way_and_resumed_equals_an_uninterrupted_run(tiny_checkpoint, tmp_path):
    records = [dict(SESSION, id=f"s{i}") for i in range(6)]
    sessions = write_sessions(tmp_path / "s.jsonl", records)
    whole = replay([sessions], tiny_checkpoint, tmp_path / "whole", ReplayOptions(k=2, device="cpu", part_sessions=1))
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "mtp_observe", "replay", str(sessions), "--model", str(tiny_checkpoint),
                             "--k", "2", "--device", "cpu", "--out", str(out), "--part-sessions", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and len(list((out / "requests.parquet").glob("part-*"))) < 2:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(list((out / "requests.parquet").glob("part-*")))
    assert 2 <= done < 6, f"the kill came too late to test anything ({done} parts)"
    assert json.loads((out / "run.json").read_text())["status"] == "running"
    again = run_cli("replay", sessions, "--model", tiny_checkpoint, "--k", "2", "--device", "cpu", "--out", out)
    assert again.returncode == 2 and "--resume" in again.stderr  # an existing run needs --resume or --overwrite
    resumed = run_cli("replay", sessions, "--model", tiny_checkpoint, "--k", "2", "--device", "cpu", "--out", out, "--resume",
                      "--part-sessions", "1")
    assert resumed.returncode == 0, resumed.stderr
    for table in ("positions.parquet", "requests.parquet"):
        names = sorted(p.name for p in (whole / table).iterdir())
        assert names == sorted(p.name for p in (out / table).iterdir())  # no temporaries left behind
        for name in names:
            assert (whole / table / name).read_bytes() == (out / table / name).read_bytes(), name
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "complete" and len(manifest["resumed"]) == 1
    assert manifest["counts"] == json.loads((whole / "run.json").read_text())["counts"]


def test_ctrl_c_keeps_the_finished_sessions_counts_them_in_run_json_and_says_how_to_resume(tiny_checkpoint, tmp_path):
    """Parts of 3 sessions: at Ctrl-C the sessions finished since the last part are written too, and run.json's
    counts (and the message) are what the parts on disk hold."""
    SESSIONS = 40
    records = [dict(SESSION, id=f"s{i}") for i in range(SESSIONS)]
    sessions = write_sessions(tmp_path / "s.jsonl", records)
    out = tmp_path / "interrupted"
    proc = subprocess.Popen([sys.executable, "-m", "mtp_observe", "replay", str(sessions), "--model", str(tiny_checkpoint),
                             "--k", "2", "--device", "cpu", "--out", str(out), "--part-sessions", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    deadline = time.time() + 300
    while time.time() < deadline and len(list((out / "requests.parquet").glob("part-*"))) < 1:
        time.sleep(0.05)
    time.sleep(0.5)  # into the next group
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate()
    on_disk = pq.read_table(out / "requests.parquet", columns=["session_id"]).column("session_id").to_pylist()
    done = len(set(on_disk))
    assert done < SESSIONS, "the interrupt came too late to test anything"
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    message = stderr.strip().splitlines()[-1]
    assert message == f"interrupted: {done} finished sessions are kept in {out}; continue with the same command and --out {out} --resume"
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "failed" and manifest["counts"]["sessions_ok"] == done > 0
    assert manifest["counts"]["requests"] == len(on_disk)
    assert manifest["counts"]["rows"] == pq.read_table(out / "positions.parquet", columns=["depth"]).num_rows
    resumed = run_cli("replay", sessions, "--model", tiny_checkpoint, "--k", "2", "--device", "cpu", "--out", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "run.json").read_text())["counts"]["sessions_ok"] == SESSIONS
    ids = pq.read_table(out / "requests.parquet", columns=["session_id"]).column("session_id").to_pylist()
    from collections import Counter

    assert sorted(set(ids)) == sorted(r["id"] for r in records)
    assert len(set(Counter(ids).values())) == 1  # every session's requests once: nothing written twice


def test_resume_refuses_a_run_with_different_options(tiny_checkpoint, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    out = tmp_path / "run"
    replay([sessions], tiny_checkpoint, out, ReplayOptions(k=2, device="cpu", max_sessions=1))
    manifest = json.loads((out / "run.json").read_text())
    manifest["status"] = "running"
    (out / "run.json").write_text(json.dumps(manifest))
    r = run_cli("replay", sessions, "--model", tiny_checkpoint, "--k", "3", "--device", "cpu", "--out", out, "--resume")
    assert r.returncode == 2 and "k differs" in r.stderr


def test_overwrite_replaces_a_run_but_never_a_foreign_directory(tiny_checkpoint, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    out = tmp_path / "run"
    replay([sessions], tiny_checkpoint, out, ReplayOptions(k=1, device="cpu"))
    r = run_cli("replay", sessions, "--model", tiny_checkpoint, "--k", "1", "--device", "cpu", "--out", out, "--overwrite")
    assert r.returncode == 0, r.stderr
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("precious")
    r = run_cli("replay", sessions, "--model", tiny_checkpoint, "--device", "cpu", "--out", foreign, "--overwrite")
    assert r.returncode == 2 and "notes.txt" in r.stderr and (foreign / "notes.txt").exists()


# --- bad input --------------------------------------------------------------------------------


def test_a_bad_session_stops_the_run_with_one_line_and_exit_2(tiny_checkpoint, tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(SESSION) + "\n{oops\n")
    r = run_cli("replay", path, "--model", tiny_checkpoint, "--device", "cpu", "--out", tmp_path / "run", "--k", "1")
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and f"{path}:2:" in last and "Traceback" not in r.stderr
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "failed"


def test_on_error_skip_records_the_skipped_session_and_its_reason_in_run_json(tiny_checkpoint, tmp_path):
    bad = {"id": "bad", "messages": [{"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": "zz", "content": "r"},
                                     {"role": "assistant", "content": "a"}]}
    path = write_sessions(tmp_path / "s.jsonl", [SESSION, bad, dict(SESSION, id="after")])
    r = run_cli("replay", path, "--model", tiny_checkpoint, "--device", "cpu", "--out", tmp_path / "run", "--k", "1", "--on-error", "skip")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["counts"]["sessions_ok"] == 2 and manifest["counts"]["sessions_skipped"] == 1
    [error] = manifest["errors"]
    assert error["session_id"] == "bad" and error["line"] == 2 and "no preceding call" in error["message"]
    assert set(pd.read_parquet(tmp_path / "run" / "positions.parquet").session_id) == {"demo", "after"}


@pytest.mark.parametrize("args, needle", [
    (["--k", "0"], "--k 0"),
    (["--sampling", "bad"], "--sampling bad"),
    (["--sampling", "x=1,0.9"], "--sampling x=1,0.9"),
    (["--sampling", "x=1,0.9,20,mystery=2"], "unknown key 'mystery'"),
    (["--sampling", "x=1,1.5,20"], "top_p 1.5 is outside (0, 1]"),
    (["--sampling", "recorded=1,1,0"], "'recorded' is the profile of each session's own sampler"),
    (["--recorded-with", "nobody"], "--recorded-with nobody: no such profile"),
    (["--device", "tpu"], "--device tpu"),
    (["--dtype", "int8"], "--dtype int8"),
    (["--max-sessions", "0"], "--max-sessions 0"),
])
def test_bad_options_are_one_line_and_exit_2(tiny_checkpoint, tmp_path, args, needle):
    path = write_sessions(tmp_path / "s.jsonl", [SESSION])
    r = run_cli("replay", path, "--model", tiny_checkpoint, "--out", tmp_path / "run", *args)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_sessions_own_meta_sampling_scores_its_recorded_profile_and_the_others_use_the_declared_one(tiny_checkpoint, tmp_path):
    own = dict(SESSION, id="own", meta={"sampling": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "presence_penalty": 1.5,
                                                     "seed": 7, "max_tokens": 512, "min_p": None}})
    path = write_sessions(tmp_path / "s.jsonl", [own, dict(SESSION, id="plain")])
    run = replay([path], tiny_checkpoint, tmp_path / "run", ReplayOptions(k=2, device="cpu", recorded_with="thinking_coding"))
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["recorded_with"] == "thinking_coding" and manifest["sampling"]["recorded"]["fallback"] == "thinking_coding"
    rows = pd.read_parquet(run / "positions.parquet")
    mine, other = rows[rows.session_id == "own"], rows[rows.session_id == "plain"]
    assert (mine.p_accept_recorded == mine.p_accept_instruct_general).all()  # its own sampler is the card's instruct_general
    assert (other.p_accept_recorded == other.p_accept_thinking_coding).all()  # the declared one
    assert (mine.p_accept_recorded != mine.p_accept_thinking_coding).any()
    requests = pd.read_parquet(run / "requests.parquet")
    sampling = {r.session_id: r.recorded_sampling for r in requests.itertuples()}
    assert sampling["own"]["source"] == "session" and sampling["own"]["presence_penalty"] == 1.5
    assert sampling["plain"]["source"] == "fallback" and sampling["plain"]["temperature"] == 0.6
    fit = requests[requests.session_id == "own"].fit.iloc[0][0]
    assert fit["q_recorded"] == fit["q_instruct_general"] and fit["support_recorded"] == fit["support_instruct_general"]
    from mtp_observe.report import load_run

    loaded = load_run(run)
    assert loaded.own_sampler.tolist() == [True, False]


def test_a_malformed_meta_sampling_is_one_line_naming_the_session_or_skipped(tiny_checkpoint, tmp_path):
    bad = dict(SESSION, id="hot", meta={"sampling": {"temperature": -1}})
    path = write_sessions(tmp_path / "s.jsonl", [bad, dict(SESSION, id="fine")])
    r = run_cli("replay", path, "--model", tiny_checkpoint, "--device", "cpu", "--k", "1", "--out", tmp_path / "run")
    assert r.returncode == 2 and "session hot" in r.stderr and "meta.sampling temperature -1 < 0" in r.stderr
    r = run_cli("replay", path, "--model", tiny_checkpoint, "--device", "cpu", "--k", "1", "--out", tmp_path / "skip",
                "--on-error", "skip")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "skip" / "run.json").read_text())["counts"]["sessions_skipped"] == 1


def test_recorded_with_a_new_sampler_defines_it_and_stores_it_in_run_json(tiny_checkpoint, tmp_path):
    path = write_sessions(tmp_path / "s.jsonl", [SESSION])
    r = run_cli("replay", path, "--model", tiny_checkpoint, "--device", "cpu", "--k", "1", "--out", tmp_path / "run",
                "--recorded-with", "mine=0.9,0.9,10,1.0", "--sampling", "greedy=0,1,0,repetition_penalty=1.2")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["recorded_with"] == "mine"
    assert manifest["sampling"]["mine"] == {"temperature": 0.9, "top_p": 0.9, "top_k": 10, "min_p": 0.0,
                                            "presence_penalty": 1.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}
    assert manifest["sampling"]["greedy"]["repetition_penalty"] == 1.2  # a built-in name is replaced
    assert list(manifest["sampling"])[:4] == ["thinking_general", "thinking_coding", "instruct_general", "instruct_reasoning"]
    report = run_cli("report", tmp_path / "run", "--format", "json")
    assert json.loads(report.stdout)["recorded_with"]["declared"] == "replay"


# --- memory -----------------------------------------------------------------------------------


def replay_peak_rss(model, tmp_path, tokens: int, completion: int, vocab: int = 248_320) -> int:
    """Peak RSS (bytes: the OS's own high-water mark, memory.run_measured) of a CLI replay of one token-level
    session of `tokens` random ids (the last `completion` scored)."""
    from mtp_observe.run.memory import run_measured

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (tokens,), generator=gen).tolist()
    split = tokens - completion
    path = write_sessions(tmp_path / "long.jsonl", [{"id": "long", "prompt_token_ids": ids[:split], "completion_token_ids": ids[split:]}])
    measured = run_measured([sys.executable, "-m", "mtp_observe", "replay", str(path), "--model", str(model), "--k", "2",
                             "--device", "cpu", "--out", str(tmp_path / "run")])
    assert measured.returncode == 0, measured.stderr[-2000:]
    peak = measured.peak_rss
    rows = pq.read_table(tmp_path / "run" / "positions.parquet", columns=["depth"]).column("depth").to_numpy()
    assert (rows == 1).sum() == completion - 1 and (rows == 2).sum() == completion - 2
    print(f"peak RSS {peak / 1e9:.2f} GB")
    return peak


# The real vocabulary; everything else as small as the architecture allows (one linear, one full layer).
TINY_WITH_REAL_VOCABULARY = dict(vocab_size=248_320, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                 num_attention_heads=1, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
                                 linear_num_value_heads=1, linear_key_head_dim=16, linear_value_head_dim=16, shards=1)


# Slow (70 s of the default suite's time): its smaller versions stay in the default suite, the MoE target's 4,096
# positions below (nothing vocabulary-sized per position) and the NextN target's 16,384-token session.
@pytest.mark.slow
@pytest.mark.manual  # a 32k-token session on the real vocabulary: run by hand, out of .ci/run
def test_replaying_a_32k_token_session_with_the_real_vocabulary_stays_under_6_gb(make_checkpoint, tmp_path):
    peak = replay_peak_rss(make_checkpoint(**TINY_WITH_REAL_VOCABULARY), tmp_path, 32_768, 8_192)
    assert peak < 6e9, f"peak RSS {peak / 1e9:.2f} GB"


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_replaying_on_a_moe_target_keeps_nothing_vocabulary_sized_per_position(make_checkpoint, tmp_path):
    """4,096 positions of fp32 logits over the real vocabulary would be 4.1 GB on their own."""
    model = make_checkpoint(**TINY_WITH_REAL_VOCABULARY, family="qwen3_5_moe", moe_intermediate_size=32,
                            shared_expert_intermediate_size=32)
    peak = replay_peak_rss(model, tmp_path, 4_096, 1_024)
    assert peak < 2.5e9, f"peak RSS {peak / 1e9:.2f} GB"


# DeepSeek-V3's vocabulary; the rest as small as MLA, its grouped router and one dense and one MoE layer allow.
NEXTN_WITH_REAL_VOCABULARY = dict(family="deepseek_v3", layout="text", vocab_size=129_280, hidden_size=16, intermediate_size=32,
                                  num_hidden_layers=2, num_attention_heads=1, q_lora_rank=8, kv_lora_rank=8,
                                  qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, moe_intermediate_size=32, shards=1)


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_a_nextn_target_at_deepseeks_vocabulary_replays_a_16k_token_session_within_the_moe_peak(make_checkpoint, tmp_path):
    """The MoE bound above (2.5 GB) for a DeepSeek-V3-layout target and NextN head over 16,384 tokens, 2,048 of them
    scored: the head's fp32 logits at K = 2 over 129,280 tokens would be 2.1 GB on their own, the target's at those
    positions another 1.1 GB."""
    peak = replay_peak_rss(make_checkpoint(**NEXTN_WITH_REAL_VOCABULARY), tmp_path, 16_384, 2_048, vocab=129_280)
    assert peak < 2.5e9, f"peak RSS {peak / 1e9:.2f} GB"


# --- data-parallel ----------------------------------------------------------------------------


@pytest.mark.slow  # in .ci/run's slow step, after the default suite (README: Tests)
def test_torchrun_with_two_processes_gives_the_same_rows_as_one(tiny_checkpoint, tmp_path):
    records = [dict(SESSION, id=f"s{i}") for i in range(5)]
    bad = {"id": "bad", "messages": [{"role": "user", "content": "q"}]}
    path = write_sessions(tmp_path / "s.jsonl", records[:2] + [bad] + records[2:])
    one = replay([path], tiny_checkpoint, tmp_path / "one", ReplayOptions(k=2, device="cpu", on_error="skip"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "-m", "mtp_observe", "replay", str(path), "--model", str(tiny_checkpoint), "--k", "2",
                        "--device", "cpu", "--on-error", "skip", "--out", str(tmp_path / "two")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for table, keys in (("positions.parquet", ["session_id", "request", "pos", "depth"]), ("requests.parquet", ["session_id", "request"])):
        a = pd.read_parquet(one / table).sort_values(keys).reset_index(drop=True)
        b = pd.read_parquet(tmp_path / "two" / table).sort_values(keys).reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b)
    m1 = json.loads((one / "run.json").read_text())
    m2 = json.loads((tmp_path / "two" / "run.json").read_text())
    assert m2["status"] == "complete" and m2["world_size"] == 2
    assert m1["counts"] == m2["counts"] and m1["errors"] == m2["errors"] and len(m2["errors"]) == 1
    assert m1["inputs"] == m2["inputs"]


def test_device_map_auto_gives_the_same_rows(tiny_checkpoint, tmp_path):
    path = write_sessions(tmp_path / "s.jsonl", [SESSION])
    plain = replay([path], tiny_checkpoint, tmp_path / "plain", ReplayOptions(k=2, device="cpu"))
    mapped = replay([path], tiny_checkpoint, tmp_path / "mapped", ReplayOptions(k=2, device="cpu", device_map="auto"))
    pd.testing.assert_frame_equal(pd.read_parquet(plain / "positions.parquet"), pd.read_parquet(mapped / "positions.parquet"))


def test_requests_that_share_a_prefix_give_the_same_rows_as_each_replayed_from_scratch(tiny_checkpoint, tiny_model):
    from mtp_observe.run.requests import replay_request, replay_session, shared_prefix
    from mtp_observe.sessions.reading import parse_record
    from mtp_observe.sessions.rendering import Renderer

    session = parse_record(SESSION, path="x", line=1, index=0, stem="x")
    requests = Renderer.from_model_dir(tiny_checkpoint).render(session).requests
    assert len(requests) == 2 and requests[0].input_ids[:50] == requests[1].input_ids[:50]
    shared = shared_prefix(requests[0].input_ids, requests[1].input_ids)
    _, _, carry = replay_request(tiny_model, requests[0], 3, BUILTIN_PROFILES, chunk_size=37, keep_at=shared)
    assert carry is not None and carry.length == shared > 50  # the second request starts after the first's prompt
    reused = replay_session(tiny_model, requests, 3, BUILTIN_PROFILES, chunk_size=37)
    for result, request in zip(reused, requests):
        alone, fit, _ = replay_request(tiny_model, request, 3, BUILTIN_PROFILES, chunk_size=37)
        for name, values in list(alone.items()) + list(fit.items()):
            got = result.columns[name] if name in result.columns else result.fit[name]
            if values.dtype.kind == "f":
                assert abs(values - got).max() < 1e-4, name
            else:
                assert (values == got).all(), name
