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

from mtp_observe.pipeline import ReplayOptions, replay
from mtp_observe.tables import REQUESTS_SCHEMA, positions_schema
from mtp_observe.target import BUILTIN_PROFILES, SamplingProfile, reduce_logits, sampler_probability

from .reference_head import ReferenceHead
from .test_mtp_head import _WEIGHTS

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
    ref = ReferenceHead({k: getattr(head, v) for k, v in _WEIGHTS.items()}, head.geometry, head.embed_tokens, head.lm_head)
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


def test_the_sampler_probability_follows_vllm_top_k_then_top_p_on_a_worked_example():
    # probabilities 0.5, 0.3, 0.15, 0.05 (plus a tail cut by top_k=4)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05, 1e-9]]))
    rows = torch.zeros(5, dtype=torch.long)
    tokens = torch.arange(5)
    p = sampler_probability(logits, SamplingProfile("x", 1.0, top_p=0.8, top_k=4), rows, tokens)
    assert torch.allclose(p, torch.tensor([0.625, 0.375, 0.0, 0.0, 0.0]), atol=1e-6)
    p = sampler_probability(logits, SamplingProfile("x", 1.0, top_p=1.0, top_k=2), rows, tokens)
    assert torch.allclose(p, torch.tensor([0.625, 0.375, 0.0, 0.0, 0.0]), atol=1e-6)
    p = sampler_probability(logits, SamplingProfile("x", 1.0, top_p=1.0, top_k=0), rows, tokens)
    assert torch.allclose(p, torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0]), atol=1e-6)
    p = sampler_probability(logits, SamplingProfile("x", 0.0), rows, tokens)
    assert p.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


def brute_force_sampler(logits_row: torch.Tensor, profile: SamplingProfile) -> torch.Tensor:
    """vLLM's apply_top_k_top_p written out over the whole vocabulary (ascending sort, masks), then softmax."""
    x = logits_row.double() / profile.temperature
    srt, idx = x.sort()
    if 0 < profile.top_k < len(x):
        srt = srt.masked_fill(srt < srt[len(x) - profile.top_k], float("-inf"))
    if profile.top_p < 1:
        cum = torch.softmax(srt, -1).cumsum(-1)
        drop = cum <= 1 - profile.top_p
        drop[-1] = False
        srt = srt.masked_fill(drop, float("-inf"))
    probs = torch.zeros_like(x)
    probs[idx] = torch.softmax(srt, -1)
    return probs


def test_reduce_logits_equals_brute_force_on_every_profile_and_chunking(tiny_model):
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(40, tiny_model.info.geometry.hidden_size, generator=gen) * 3
    W = tiny_model.target.lm_head.weight
    positions = torch.randint(0, 40, (120,), generator=gen)
    drafts = torch.randint(0, W.shape[0], (120,), generator=gen)
    drafts[::3] = (hidden[positions[::3]] @ W.T).argmax(-1)  # some drafts are the argmax: non-zero probabilities
    actuals = torch.randint(0, W.shape[0], (120,), generator=gen)
    # "narrow" takes its top 5 from the ranking shared with the top-20 profiles
    profiles = BUILTIN_PROFILES + (SamplingProfile("full", 1.3, 0.9, 0), SamplingProfile("greedy", 0.0), SamplingProfile("narrow", 0.9, 0.7, 5))
    small = reduce_logits(W, hidden, positions, drafts, actuals, profiles, budget=W.shape[0] * 7)  # 7 rows a chunk
    whole = reduce_logits(W, hidden, positions, drafts, actuals, profiles)
    logits = (hidden @ W.T).float()
    lp = torch.log_softmax(logits, -1)
    for red in (small, whole):
        assert torch.equal(red.target_token, logits.argmax(-1)[positions])
        assert torch.allclose(red.target_logprob, lp[positions, drafts], atol=1e-5)
        assert torch.allclose(red.actual_logprob, lp[positions, actuals], atol=1e-5)
        for prof in profiles:
            if prof.temperature == 0:
                want = (logits.argmax(-1)[positions] == drafts).float()
            else:
                want = torch.stack([brute_force_sampler(logits[q], prof)[d] for q, d in zip(positions, drafts)]).float()
            assert torch.allclose(red.p_accept[prof.name], want, atol=1e-5), prof.name
    assert float(whole.p_accept["thinking"].max()) > 0.1


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
    assert positions.schema.remove_metadata() == positions_schema(["thinking", "instruct", "hot"])
    assert requests.schema.remove_metadata() == REQUESTS_SCHEMA
    assert positions.schema.field("segment").type == pa.dictionary(pa.int8(), pa.string())
    df = positions.to_pandas()
    assert df.equals(df.sort_values(["request", "pos", "depth"], kind="stable").sort_index())  # within a session
    assert list(dict.fromkeys(df.session_id)) == ["demo", "two"]  # input order
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["schema_version"] == 2 and manifest["status"] == "complete"
    for key in ("tool", "created", "finished", "model", "tokenizer_sha256", "k", "dtype", "device", "sampling",
                "inputs", "options", "counts", "versions", "errors"):
        assert key in manifest, key
    assert manifest["model"]["config_sha256"] and len(manifest["model"]["head_tensors"]) == 15
    assert manifest["inputs"][0]["sessions"] == 2 and len(manifest["inputs"][0]["sha256"]) == 64
    assert manifest["counts"]["rows"] == len(df) and manifest["counts"]["sessions_ok"] == 2
    assert manifest["counts"]["anchors"] == int((df.depth == 1).sum())
    assert set(manifest["sampling"]) == {"thinking", "instruct", "hot"}


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
    whole = replay([sessions], tiny_checkpoint, tmp_path / "whole", ReplayOptions(k=2, device="cpu"))
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "mtp_observe", "replay", str(sessions), "--model", str(tiny_checkpoint),
                             "--k", "2", "--device", "cpu", "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
    resumed = run_cli("replay", sessions, "--model", tiny_checkpoint, "--k", "2", "--device", "cpu", "--out", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    for table in ("positions.parquet", "requests.parquet"):
        names = sorted(p.name for p in (whole / table).iterdir())
        assert names == sorted(p.name for p in (out / table).iterdir())  # no temporaries left behind
        for name in names:
            assert (whole / table / name).read_bytes() == (out / table / name).read_bytes(), name
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "complete" and len(manifest["resumed"]) == 1
    assert manifest["counts"] == json.loads((whole / "run.json").read_text())["counts"]


def test_ctrl_c_says_how_many_sessions_are_kept_and_how_to_resume(tiny_checkpoint, tmp_path):
    records = [dict(SESSION, id=f"s{i}") for i in range(40)]
    sessions = write_sessions(tmp_path / "s.jsonl", records)
    out = tmp_path / "interrupted"
    proc = subprocess.Popen([sys.executable, "-m", "mtp_observe", "replay", str(sessions), "--model", str(tiny_checkpoint),
                             "--k", "2", "--device", "cpu", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and len(list((out / "requests.parquet").glob("part-*"))) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate()
    done = len(list((out / "requests.parquet").glob("part-*")))
    assert done < 40, "the interrupt came too late to test anything"
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    message = stderr.strip().splitlines()[-1]
    assert message == f"interrupted: {done} finished sessions are kept in {out}; continue with the same command and --out {out} --resume"
    assert json.loads((out / "run.json").read_text())["status"] == "failed"
    resumed = run_cli("replay", sessions, "--model", tiny_checkpoint, "--k", "2", "--device", "cpu", "--out", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "run.json").read_text())["counts"]["sessions_ok"] == 40


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
    (["--device", "tpu"], "--device tpu"),
    (["--dtype", "int8"], "--dtype int8"),
    (["--max-sessions", "0"], "--max-sessions 0"),
])
def test_bad_options_are_one_line_and_exit_2(tiny_checkpoint, tmp_path, args, needle):
    path = write_sessions(tmp_path / "s.jsonl", [SESSION])
    r = run_cli("replay", path, "--model", tiny_checkpoint, "--out", tmp_path / "run", *args)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# --- memory -----------------------------------------------------------------------------------


def test_replaying_a_32k_token_session_with_the_real_vocabulary_stays_under_6_gb(make_checkpoint, tmp_path):
    import psutil

    # The real vocabulary; everything else as small as the architecture allows (one linear, one full layer).
    model = make_checkpoint(vocab_size=248_320, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                            num_attention_heads=1, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
                            linear_num_value_heads=1, linear_key_head_dim=16, linear_value_head_dim=16, shards=1)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 248_320, (32_768,), generator=gen).tolist()
    path = write_sessions(tmp_path / "long.jsonl", [{"id": "long", "prompt_token_ids": ids[:24_576], "completion_token_ids": ids[24_576:]}])
    proc = psutil.Popen([sys.executable, "-m", "mtp_observe", "replay", str(path), "--model", str(model), "--k", "2",
                         "--device", "cpu", "--out", str(tmp_path / "run")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = 0
    while proc.poll() is None:
        try:
            peak = max(peak, proc.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    _, stderr = proc.communicate()
    assert proc.returncode == 0, stderr.decode()[-2000:]
    rows = pq.read_table(tmp_path / "run" / "positions.parquet", columns=["depth"]).column("depth").to_numpy()
    assert (rows == 1).sum() == 8_191 and (rows == 2).sum() == 8_190
    print(f"peak RSS {peak / 1e9:.2f} GB")
    assert peak < 6e9, f"peak RSS {peak / 1e9:.2f} GB"


# --- data-parallel ----------------------------------------------------------------------------


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
    from mtp_observe.pipeline import replay_request, replay_session, shared_prefix
    from mtp_observe.rendering import Renderer
    from mtp_observe.sessions import parse_record

    session = parse_record(SESSION, path="x", line=1, index=0, stem="x")
    requests = Renderer.from_model_dir(tiny_checkpoint).render(session).requests
    assert len(requests) == 2 and requests[0].input_ids[:50] == requests[1].input_ids[:50]
    shared = shared_prefix(requests[0].input_ids, requests[1].input_ids)
    _, carry = replay_request(tiny_model, requests[0], 3, BUILTIN_PROFILES, chunk_size=37, keep_at=shared)
    assert carry is not None and carry.length == shared > 50  # the second request starts after the first's prompt
    reused = replay_session(tiny_model, requests, 3, BUILTIN_PROFILES, chunk_size=37)
    for (index, columns), request in zip(reused, requests):
        alone, _ = replay_request(tiny_model, request, 3, BUILTIN_PROFILES, chunk_size=37)
        for name, values in alone.items():
            if values.dtype.kind == "f":
                assert abs(values - columns[name]).max() < 1e-4, name
            else:
                assert (values == columns[name]).all(), name
