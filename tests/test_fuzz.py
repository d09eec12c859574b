"""Fuzzing the readers, importers and checkpoint reader with hypothesis (strategies and properties: fuzzing.py).

The default suite runs a few hundred derandomised inputs; `python -m pytest -m slow
tests/test_fuzz.py -s` runs over 5,000 (and 1,500 mutated checkpoints) and prints how many each
property saw.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mtp_observe.errors import UserError
from mtp_observe.sessions.importers import FORMATS, import_files
from mtp_observe.sessions.reading import Session, Skipped, read_sessions
from mtp_observe.sessions.rendering import Renderer

from .fuzzing import (
    OUTCOMES,
    RUNS,
    check_checkpoint,
    check_cli,
    check_engine_file,
    check_import,
    check_read,
    checkpoint_files,
    checkpoint_mutation,
    engine_files,
    generate_argv,
    log_files,
    run_cli,
    write_input,
)

ALL_SEEDED = list(FORMATS)


def fuzz(examples: int, fast: bool):
    return settings(max_examples=examples, deadline=None, derandomize=fast, database=None if fast else settings.default.database,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def renderer(tiny_checkpoint) -> Renderer:
    return Renderer.from_model_dir(tiny_checkpoint, vocab_size=1001)


def importer_property(fmt: str, directory, examples: int, fast: bool):
    """fmt's importer (or auto) on mutated logs, mostly of its own format, sometimes of another's."""

    @fuzz(examples, fast)
    @given(st.data())
    def prop(data):
        own = fmt if fmt != "auto" and data.draw(st.integers(0, 4)) else data.draw(st.sampled_from(ALL_SEEDED))
        raw, suffix = data.draw(log_files(own))
        check_import(fmt, raw, suffix, directory, on_error=data.draw(st.sampled_from(["fail", "skip"])))

    prop()


def reader_property(directory, renderer, examples: int, fast: bool):
    @fuzz(examples, fast)
    @given(st.data())
    def prop(data):
        raw, suffix = data.draw(log_files("canonical"))
        check_read(raw, suffix, directory, renderer, data.draw(st.sampled_from(["fail", "skip"])))

    prop()


def cli_property(directory, checkpoint, examples: int, fast: bool, command: str):
    @fuzz(examples, fast)
    @given(st.data())
    def prop(data):
        if command == "import":
            fmt = data.draw(st.sampled_from([*FORMATS, "auto"]))
            raw, suffix = data.draw(log_files(fmt if fmt != "auto" else data.draw(st.sampled_from(ALL_SEEDED))))
            paths = write_input(raw, suffix, directory)
            check_cli(["import", fmt, *map(str, paths), "-o", str(directory / "out.jsonl"), "--overwrite"], "cli import")
        else:
            raw, suffix = data.draw(log_files("canonical"))
            path = directory / f"input{suffix}"
            path.write_bytes(raw)
            check_cli(["sessions", str(path), "--model", str(checkpoint)], "cli sessions")

    prop()


# --- the default suite: a few hundred inputs, the same every run ------------------------------


@pytest.mark.parametrize("fmt", [*FORMATS, "auto"])
def test_no_mutated_log_makes_an_importer_raise_anything_but_a_one_line_user_error(fmt, tmp_path):
    importer_property(fmt, tmp_path, examples=40, fast=True)


def test_no_mutated_session_file_makes_the_reader_or_renderer_raise_anything_but_a_user_error(tmp_path, renderer):
    reader_property(tmp_path, renderer, examples=60, fast=True)


def test_every_import_refusal_through_the_cli_is_exit_2_with_one_line(tmp_path, tiny_checkpoint):
    cli_property(tmp_path, tiny_checkpoint, examples=30, fast=True, command="import")


def checkpoint_property(tmp_path, tiny_checkpoint, examples: int, fast: bool, replay: bool = False):
    """inspect, sessions (and replay) on the tiny checkpoint with one file mutated."""
    import shutil

    from .test_replay import SESSION

    directory = tmp_path / "checkpoint"
    shutil.copytree(tiny_checkpoint, directory)
    pristine = checkpoint_files(directory)
    sessions = tmp_path / "s.jsonl"
    sessions.write_text(json.dumps(SESSION) + "\n")
    commands = [["inspect", str(directory), "--json"], ["sessions", str(sessions), "--model", str(directory)]]
    if replay:
        commands.append(["replay", str(sessions), "--model", str(directory), "--out", str(tmp_path / "run"), "--overwrite",
                         "--k", "1", "--device", "cpu"])

    @fuzz(examples, fast)
    @given(st.data())
    def prop(data):
        check_checkpoint(directory, pristine, data.draw(checkpoint_mutation(pristine)), commands)

    prop()


def test_no_mutated_checkpoint_makes_inspect_or_sessions_raise_anything_but_a_one_line_error(tmp_path, tiny_checkpoint):
    before = dict(OUTCOMES)
    checkpoint_property(tmp_path, tiny_checkpoint, examples=60, fast=True)
    seen = {k: v - before.get(k, 0) for k, v in OUTCOMES.items() if "(checkpoint)" in k}
    assert seen.get("cli inspect (checkpoint): exit 2", 0) > 0 and seen.get("cli inspect (checkpoint): exit 0", 0) > 0, seen


def engine_property(examples: int, fast: bool):
    @fuzz(examples, fast)
    @given(engine_files())
    def prop(text):
        check_engine_file(text)

    prop()


def test_no_mutated_engine_counter_file_is_read_as_anything_but_a_sane_measurement_or_one_line(tmp_path):
    """compare's --engine-metrics readers (vLLM /metrics text, per-request JSON, SGLang logs) on mutated files:
    a measurement whose rates and acceptance length can be one, or one EngineMetricsError line; memory bounded."""
    before = dict(OUTCOMES)
    engine_property(examples=300, fast=True)
    seen = {k: v - before.get(k, 0) for k, v in OUTCOMES.items() if k.startswith("engine metrics")}
    assert seen.get("engine metrics: refused", 0) > 0 and sum(v for k, v in seen.items() if "read (" in k) > 0, seen


def compare_cli_property(directory, run_dir, examples: int, fast: bool):
    @fuzz(examples, fast)
    @given(engine_files())
    def prop(text):
        path = directory / "m.txt"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        RUNS["cli compare"] += 1
        code, _, err = run_cli(["compare", str(run_dir), "--engine-metrics", str(path), "--replicates", "50"])
        assert code in (0, 1, 2) and "Traceback" not in err, (code, err)
        OUTCOMES[f"cli compare: exit {code}"] += 1
        if code == 2:
            lines = [line for line in err.strip().splitlines() if not line.startswith("warning: ")]
            assert len(lines) == 1 and lines[0].startswith("error: "), err

    prop()


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    from .handmade import random_sessions, write_run

    return write_run(tmp_path_factory.mktemp("fuzz-run") / "run", random_sessions(12, 4, 0.7, seed=3), k=4, draft_cost=0.1)


def test_every_compare_of_a_mutated_counter_file_agrees_disagrees_or_is_refused_in_one_line(tmp_path, small_run):
    compare_cli_property(tmp_path, small_run, examples=25, fast=True)


def generate_property(directory, checkpoint, examples: int, fast: bool):
    from .test_replay import SESSION

    sessions = directory / "s.jsonl"
    sessions.write_text(json.dumps(SESSION) + "\n")

    @fuzz(examples, fast)
    @given(generate_argv())
    def prop(argv):
        check_cli(["generate", str(sessions), "-o", str(directory / "own.jsonl"), "--overwrite", "--model", str(checkpoint),
                   *argv], "cli generate")

    prop()


def test_generate_options_valid_at_a_bound_or_impossible_exit_0_or_2_with_one_line(tmp_path, tiny_checkpoint):
    before = dict(OUTCOMES)
    generate_property(tmp_path, tiny_checkpoint, examples=30, fast=True)
    seen = {k: v - before.get(k, 0) for k, v in OUTCOMES.items() if k.startswith("cli generate")}
    assert seen.get("cli generate: exit 2", 0) > 0 and seen.get("cli generate: exit 0", 0) > 0, seen


# --- slow: over 5,000 inputs ------------------------------------------------------------------

SLOW = {"engine": 1500, "cli compare": 150, "cli generate": 100, "import": 400, "auto": 800, "read": 1200, "cli import": 400, "cli sessions": 60, "checkpoint": 1400, "checkpoint replay": 100}


@pytest.mark.slow
@pytest.mark.manual  # over 15 minutes of fuzzing on 2 cores (a .ci/run, 2026-12-03): run by hand, out of .ci/run
def test_fuzz_the_readers_and_importers_with_over_5000_inputs(tmp_path, tiny_checkpoint, renderer, small_run):
    before = sum(RUNS.values())
    engine_property(examples=SLOW["engine"], fast=False)
    compare_cli_property(tmp_path, small_run, examples=SLOW["cli compare"], fast=False)
    (tmp_path / "generated").mkdir()
    generate_property(tmp_path / "generated", tiny_checkpoint, examples=SLOW["cli generate"], fast=False)
    for fmt in FORMATS:
        importer_property(fmt, tmp_path, examples=SLOW["import"], fast=False)
    importer_property("auto", tmp_path, examples=SLOW["auto"], fast=False)
    reader_property(tmp_path, renderer, examples=SLOW["read"], fast=False)
    cli_property(tmp_path, tiny_checkpoint, examples=SLOW["cli import"], fast=False, command="import")
    cli_property(tmp_path, tiny_checkpoint, examples=SLOW["cli sessions"], fast=False, command="sessions")
    checkpoint_property(tmp_path, tiny_checkpoint, examples=SLOW["checkpoint"], fast=False)
    checkpoint_property(tmp_path / "replayed", tiny_checkpoint, examples=SLOW["checkpoint replay"], fast=False, replay=True)
    total = sum(RUNS.values()) - before
    print(f"\nfuzzing: {total} inputs: " + ", ".join(f"{k} {v}" for k, v in sorted(RUNS.items())))
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(OUTCOMES.items())))
    assert total >= 5000, RUNS


# --- what the fuzzing found, kept as plain regression tests -----------------------------------


def test_a_line_nested_too_deeply_is_one_error_naming_the_line(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text('{"messages": []}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    items = list(read_sessions([path], on_error="skip"))
    assert [type(i) for i in items] == [Skipped, Skipped]
    assert items[1].line == 2 and "nested too deeply" in items[1].message


def test_a_lone_surrogate_escape_is_refused_before_it_reaches_the_tokenizer(tmp_path, tiny_checkpoint):
    path = tmp_path / "s.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "\\ud83d\\ude00 fine"}, {"role": "assistant", "content": "a"}]}\n'
                    '{"messages": [{"role": "user", "content": "x\\ud800"}, {"role": "assistant", "content": "a"}]}\n')
    items = list(read_sessions([path], on_error="skip"))
    assert isinstance(items[0], Session) and items[0].messages[0]["content"] == "\U0001f600 fine"  # a pair is fine
    assert isinstance(items[1], Skipped) and "lone surrogate (\\ud800)" in items[1].message
    code, _, err = run_cli(["sessions", str(path), "--model", str(tiny_checkpoint)])
    assert code == 2 and err.strip().splitlines() == [f"error: {path}:2: a string holds a lone surrogate (\\ud800), which is not Unicode text; fix that escape"]


def test_tool_calls_of_the_wrong_type_are_refused_by_the_reader_not_crashed_on(tmp_path):
    path = tmp_path / "runs-x.json"
    path.write_text(json.dumps([{"task_id": 0, "trial": 0, "traj": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": 1.0}]}]))
    with pytest.raises(UserError, match=r"runs-x.json: \[0\]: session runs-x:0:0: message 1 tool_calls must be a list"):
        import_files("tau-bench", [path], tmp_path / "out.jsonl")


CASSETTE = "interactions:\n- request:\n    uri: https://api.anthropic.com/v1/messages\n    parsed_body:\n      max_tokens: 5\n      messages:\n"
USER_ASKS = "      - role: user\n        content: q\n"
YAML_CASES = {
    "a date where text goes": (CASSETTE + "      - role: user\n        content: 2024-01-01\n", "content: must be a list, not date"),
    "an impossible date": (CASSETTE + "      - role: user\n        content: 2001-02-30\n", "invalid YAML value (day is out of range for month)"),
    "an unhashable key": (CASSETTE + "      - role: user\n        content: {? [1, 2] : x}\n", "invalid YAML (found unhashable key at line 8"),
    "a python tag": (CASSETTE + "      - !!python/object:os.system {}\n", "invalid YAML (could not determine a constructor"),
    "an alias that contains itself": (CASSETTE + USER_ASKS + "      - role: assistant\n        content:\n        - {type: tool_use, id: t, name: f, input: &b {x: [*b]}}\n",
                                      "session cassette:0: holds a value that contains itself"),
    "binary tool arguments": (CASSETTE + USER_ASKS + "      - role: assistant\n        content:\n        - {type: tool_use, id: t, name: f, input: {b: !!binary aGk=}}\n",
                              "session cassette:0: holds a value JSON cannot hold"),
    "NaN in tool arguments": (CASSETTE + USER_ASKS + "      - role: assistant\n        content:\n        - {type: tool_use, id: t, name: f, input: {n: .nan}}\n",
                              "session cassette:0: holds NaN or Infinity"),
}


@pytest.mark.parametrize("case", list(YAML_CASES))
def test_yaml_values_json_cannot_hold_are_refused_in_one_line_naming_the_file(tmp_path, case):
    text, needle = YAML_CASES[case]
    path = tmp_path / "cassette.yaml"
    path.write_text(text)
    for fmt in ("anthropic", "auto"):
        with pytest.raises(UserError) as e:
            import_files(fmt, [path], tmp_path / "out.jsonl")
        assert str(e.value).startswith(f"{path}: ") and needle in str(e.value) and "\n" not in str(e.value), str(e.value)
