"""Refusals that hold and name the right thing: `replay --dry-run` refuses at once what the run refuses at once (one
check for both); what-if thresholds outside [0, 1] hand-written into run.json are a damaged run, not a measurement;
`--head-precision q4_k` is refused as q4_k (not as the Q8_0 its lm_head falls back to); `merge -o EXISTING` advises
the --overwrite merge has, not a --resume it has not."""

from __future__ import annotations

import json

import pytest

from .test_replay import SESSION, run_cli, write_sessions

GLM = dict(family="glm4_moe", layout="text")


def one_line(r, *needles) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, \
        (r.returncode, r.stdout, r.stderr)
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# --- --dry-run refuses what the run refuses at once ----------------------------------------------------------------


@pytest.mark.parametrize("case", ["precision", "nextn-tree", "model-free-tree"])
def test_a_dry_run_refuses_what_the_run_refuses_at_once_with_the_same_line(make_checkpoint, tmp_path, case):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    model, extra, said = {
        # rows of 200 values (the MLP's) fit no Q8_0 block of 32, and llama-quantize has no fallback for Q8_0
        "precision": (make_checkpoint(dtype="bfloat16", intermediate_size=200), ["--head-precision", "q8_0"],
                      "rows of 200 values, not a multiple of 32"),
        "nextn-tree": (make_checkpoint(**GLM), ["--tree", "2,2,3"], "glm4_moe's NextN head"),
        "model-free-tree": (make_checkpoint(), ["--tree", "2,2,4", "--drafters", "ngram"], "model-free drafters only"),
    }[case]
    base = ["replay", sessions, "--model", model, "--device", "cpu", "--k", "2", *extra]
    run = one_line(run_cli(*base, "--out", tmp_path / "run"), said)
    dry = one_line(run_cli(*base, "--dry-run"), said)
    assert dry == run  # one check, one line
    assert not (tmp_path / "run").exists()


def test_a_dry_run_the_run_accepts_still_estimates(make_checkpoint, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    r = run_cli("replay", sessions, "--model", make_checkpoint(), "--device", "cpu", "--k", "2", "--tree", "2,2,4",
                "--head-precision", "bf16", "--dry-run")
    assert r.returncode == 0 and "estimate" in r.stdout.lower(), (r.stdout, r.stderr)


# --- refusals that name the right thing ----------------------------------------------------------------------------


def test_a_gguf_precision_refused_for_its_lm_head_is_named_as_asked_with_the_type_its_rows_did_not_fit(make_checkpoint,
                                                                                                     tmp_path):
    """hidden 48: a Q4_K file stores the lm_head as Q8_0 (its rows are no multiple of 256) and Q8_0 needs 32 with no
    fallback (llama-quant.cpp: "Unsupported tensor size encountered"); the user asked for q4_k, so q4_k is named."""
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION])
    model = make_checkpoint(hidden_size=48)
    for precision in ("q4_k", "q6_k"):
        line = one_line(run_cli("replay", sessions, "--model", model, "--device", "cpu", "--head-precision", precision,
                                "--out", tmp_path / "run"),
                        f"--head-precision {precision}: lm_head.weight has rows of 48 values, not a multiple of 32",
                        f"a {precision.upper()} file stores lm_head.weight as Q8_0", "drop it from --head-precision")
        assert "--head-precision q8_0" not in line
    line = one_line(run_cli("replay", sessions, "--model", model, "--device", "cpu", "--head-precision", "q8_0",
                            "--out", tmp_path / "run"), "--head-precision q8_0: ", "has rows of 48 values")
    assert "stores" not in line  # asked for Q8_0 itself (a head matrix is refused first): nothing fell back


def test_merge_onto_an_existing_run_advises_overwrite_not_a_resume_merge_does_not_have(tiny_checkpoint, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [{**SESSION, "id": f"s{i}"} for i in range(3)])
    shards = [tmp_path / f"shard-{i}" for i in range(2)]
    for i, out in enumerate(shards):
        r = run_cli("replay", sessions, "--model", tiny_checkpoint, "--device", "cpu", "--k", "2", "--drafters", "ngram",
                    "--shard", f"{i}/2", "--out", out)
        assert r.returncode == 0, r.stderr
    merged = tmp_path / "merged"
    assert run_cli("merge", *shards, "-o", merged).returncode == 0
    line = one_line(run_cli("merge", *shards, "-o", merged), f"{merged}: already exists", "--overwrite")
    assert "--resume" not in line
    assert run_cli("merge", *shards, "-o", merged, "--overwrite").returncode == 0  # the advice works


# --- thresholds hand-written into run.json -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def threshold_run(tiny_checkpoint, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("thresholds")
    sessions = write_sessions(tmp / "s.jsonl", [SESSION, {**SESSION, "id": "other"}])
    r = run_cli("replay", sessions, "--model", tiny_checkpoint, "--device", "cpu", "--k", "2", "--draft-p-min", "0.3,0.8",
                "--head-precision", "bf16", "--out", tmp / "run")
    assert r.returncode == 0, r.stderr
    return tmp / "run"


@pytest.mark.parametrize("draft_p_min, said", [
    ([0.3, 1.5], "whatifs.draft_p_min holds 1.5, not a probability in [0, 1]"),
    ([-0.2, 0.8], "whatifs.draft_p_min holds -0.2"),
    ([0.3, "0.8"], "whatifs.draft_p_min holds '0.8'"),
    ([0.3, 0.3], "whatifs.draft_p_min repeats a threshold"),
    ("0.3", "whatifs.draft_p_min holds '0.3'"),
])
def test_thresholds_outside_0_1_written_into_run_json_are_a_damaged_run_not_a_measurement(threshold_run, tmp_path,
                                                                                        draft_p_min, said):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(threshold_run, run)
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["whatifs"]["draft_p_min"] == [0.3, 0.8]
    assert run_cli("report", run, "--format", "json", "--replicates", "20").returncode in (0, 1)  # as written: read
    manifest["whatifs"]["draft_p_min"] = draft_p_min
    (run / "run.json").write_text(json.dumps(manifest))
    for argv in (["report", run, "--replicates", "20"], ["report", run, "--format", "json", "--replicates", "20"],
                 ["export", run, "--force"]):
        one_line(run_cli(*argv), f"{run / 'run.json'}: {said}", "damaged or was edited by hand", "re-run replay")


def test_an_unknown_head_precision_written_into_run_json_is_a_damaged_run(threshold_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(threshold_run, run)
    manifest = json.loads((run / "run.json").read_text())
    manifest["whatifs"]["head_precision"] = ["q3_k"]
    (run / "run.json").write_text(json.dumps(manifest))
    one_line(run_cli("report", run, "--replicates", "20"), "whatifs.head_precision holds 'q3_k'", "re-run replay")
