"""`report --format json` is JSON to a strict parser: no NaN or Infinity anywhere (null instead). A tree of depth >= 2
has no v(K) below its depth (another configuration), which the report printed as a bare NaN; and every report JSON
the suite produces is checked the same way (tests/strict_json.py, hooked into every CLI call)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mtp_observe.report.document import dumps, finite

from .strict_json import check_report_output, strict_loads
from .test_replay import SESSION, run_cli, write_sessions


def test_a_tree_of_depth_2_or_more_reports_strict_json_with_null_where_v_k_is_undefined(tiny_checkpoint, tmp_path):
    sessions = write_sessions(tmp_path / "s.jsonl", [SESSION, {**SESSION, "id": "other"}])
    run = tmp_path / "run"
    r = run_cli("replay", sessions, "--model", tiny_checkpoint, "--device", "cpu", "--k", "3", "--tree", "3,2,6",
                "--tree", "2,2,4", "--out", run)
    assert r.returncode == 0, r.stderr
    r = run_cli("report", run, "--format", "json", "--replicates", "50")
    assert r.returncode in (0, 1), r.stderr
    assert "NaN" not in r.stdout and "Infinity" not in r.stdout
    doc = strict_loads(r.stdout)
    trees = {t["name"]: t for t in doc["trees"]}
    for name, steps in (("tree:3,2,6", 3), ("tree:2,2,4", 2)):
        v = trees[name]["cost"]["verify_extra"]
        assert len(v) == steps and v[:-1] == [None] * (steps - 1)  # below S: another configuration, undefined
        assert isinstance(v[-1], float) and math.isfinite(v[-1])  # at S: the tree's own verify


def test_the_writer_maps_every_non_finite_number_to_null_and_refuses_nothing_else():
    doc = {"a": float("nan"), "b": [1.5, float("inf"), -float("inf")], "c": {"d": np.float32("nan"), "e": np.float64(2.5)},
           "f": (np.int64(3), True, None, "NaN"), "g": np.bool_(False)}
    assert finite(doc) == {"a": None, "b": [1.5, None, None], "c": {"d": None, "e": 2.5}, "f": [3, True, None, "NaN"],
                           "g": False}
    assert strict_loads(dumps(doc)) == finite(doc)
    with pytest.raises(ValueError):
        json.dumps({"x": float("nan")}, allow_nan=False)  # the writer's own guard, were anything left


def test_the_suites_check_refuses_a_report_that_prints_a_bare_nan_and_ignores_other_commands():
    argv = ["report", "RUN", "--format", "json"]
    for bad in ('{"a": NaN}', '{"a": [Infinity]}', '{"a": -Infinity}'):
        with pytest.raises(ValueError, match="bare"):
            check_report_output(argv, 0, bad)
    check_report_output(argv, 0, '{"a": null}')
    check_report_output(["report", "RUN", "--format", "table"], 0, "NaN")  # not JSON: not checked
    check_report_output(["export", "RUN"], 0, "NaN")
    check_report_output(argv, 2, "")  # a refusal prints nothing on stdout
    with pytest.raises(ValueError):
        check_report_output(["report", "RUN", "--format=json"], 1, '{"a": NaN}')  # a failing --gate's JSON too
