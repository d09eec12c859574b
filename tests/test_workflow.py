"""The nightly workflow is valid YAML and calls only commands and options that exist."""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
SHELL_WORDS = {".", "set", "test", "echo", "cat", "if", "then", "else", "fi", "exit", "export", "true", "["}


def run_scripts() -> list[str]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    return [step["run"] for job in doc["jobs"].values() for step in job["steps"] if "run" in step]


def commands(script: str) -> list[list[str]]:
    """Simple commands of a shell script (continuations joined; split on ; && || | and 'then'); ${{ }} blanked."""
    script = re.sub(r"\$\{\{[^}]*\}\}", "X", script.replace("\\\n", " "))
    out = []
    for line in script.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for part in re.split(r";|&&|\|\||\|(?!\|)|\bthen\b|\{|\}", line):
            words = shlex.split(part, posix=True) if part.strip() else []
            while words and "=" in words[0] and not words[0].startswith(("-", "=")):  # VAR=value prefixes
                words = words[1:]
            if words:
                out.append(words)
    return out


def test_the_nightly_workflow_is_valid_yaml_with_a_gpu_job():
    doc = yaml.safe_load(WORKFLOW.read_text())
    job = doc["jobs"]["gate"]
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    assert {"schedule", "workflow_dispatch"} <= set(doc[True] if True in doc else doc["on"])  # YAML 1.1 reads `on` as True
    names = [s.get("name", s.get("uses", "")) for s in job["steps"]]
    assert any("Upload" in n for n in names) and any("Fail on NO-GO" in n for n in names)
    uploads = {s["with"]["name"]: s["with"]["path"] for s in job["steps"] if "upload-artifact" in s.get("uses", "")}
    assert uploads["speculation-profile"] == "engines"  # the exported profile, an artifact of its own
    assert names.index("Export the acceptance profile for the engines") > names.index("Report and gate")


def test_every_mtp_observe_call_in_the_workflow_uses_an_existing_command_and_options():
    import typer.main

    from mtp_observe.cli import app

    group = typer.main.get_command(app)
    calls = [c for script in run_scripts() for c in commands(script) if c[0] == "mtp-observe"]
    assert {c[1] for c in calls} == {"replay", "report", "export"}
    for call in calls:
        command = group.commands[call[1]]
        known = {opt for p in command.params for opt in p.opts}
        for word in call[2:]:
            if word.startswith("--"):
                assert word.split("=")[0] in known, f"mtp-observe {call[1]} has no option {word}"
    engines = {c[c.index("--engine") + 1] for c in calls if c[1] == "export"}
    assert engines == {"speculation-profile", "vllm", "sglang", "trtllm", "aiconfigurator"}  # every export, as an artifact
    used = {w for c in calls for w in c if w.startswith("--")}
    assert {"--gate", "--format", "--baseline", "--min-on-policy", "--model", "--out", "--on-error"} <= used


def test_every_other_command_in_the_workflow_exists():
    bin_dir = str(Path(sys.executable).parent)
    for script in run_scripts():
        for words in commands(script):
            word = words[0]
            if word in SHELL_WORDS:
                continue
            assert shutil.which(word, path=bin_dir + ":/usr/bin:/bin") or word == "mtp-observe", f"unknown command {word!r}"
