"""tau-bench: historical trajectories (sierra-research/tau-bench, `historical_trajectories/*.json`).

Input: one JSON document, a list of runs `{"task_id", "trial", "reward", "info", "traj"}` where
`traj` is the agent's conversation in OpenAI chat form (system, user, assistant with
`tool_calls`, tool with `tool_call_id` and `name`), as litellm returned it. One run -> one session.

Mapping decisions:
- Messages pass through in OpenAI form; only the fields the canonical form knows are kept
  (role, content, tool_calls, tool_call_id, name, and reasoning under `reasoning_content`
  when a model logged it as `reasoning_content` or `reasoning`).
- The system prompt is the traj's own system message; a traj without one records
  `missing: ["system_prompt"]`.
- Tool schemas are not in the trajectories. They come from `--tools FILE`, else from a file
  beside the input named after the domain — the last `-` part of the file name
  (`gpt-4o-airline.json` -> `tools_airline.openai.json` or `tools_airline.json`) — else they
  are recorded missing. `supplied.tools` names the file used.
- Tool results keep their `tool_call_id`; the reader pairs each with the nearest preceding
  call with that id (gpt-4o reuses ids within one run). A result with no preceding call is
  dropped and counted (`dropped.orphan_tool_results`).
- id: `<file stem>:<task_id>:<trial>` (runs are numbered by task and trial; `<file stem>:<index>`
  when either is absent). `original` keeps task_id, trial and reward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from .common import (
    Options,
    Source,
    as_dict,
    as_list,
    drop_orphan_results,
    each_record,
    kind,
    load_tools_file,
    meta,
    originals,
    session,
    tools_beside,
)

FORMAT = "tau-bench"
MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


def detect(document) -> bool:
    return isinstance(document, list) and bool(document) and isinstance(document[0], dict) and "traj" in document[0]


def domain_of(path: Path) -> str:
    """The domain at the end of a trajectory file's name: gpt-4o-airline.json -> airline."""
    return path.name.removesuffix(".json").rsplit("-", 1)[-1]


def convert_message(m, where: str) -> dict:
    m = as_dict(m, where)
    out = {k: m[k] for k in MESSAGE_KEYS if k in m and m[k] is not None}
    if m.get("role") == "assistant":
        for key in ("reasoning_content", "reasoning"):
            if m.get(key) is not None:
                out["reasoning_content"] = m[key]
                break
    return out


def convert_run(i: int, run, source: Source, tools: list[dict] | None, tools_file: Path | None) -> dict:
    """Pure: run i of the parsed document -> one canonical session."""
    where = f"[{i}]"
    run = as_dict(run, where)
    traj = as_list(run.get("traj"), f"{where}.traj")
    messages = [convert_message(m, f"{where}.traj[{j}]") for j, m in enumerate(traj)]
    messages, orphans = drop_orphan_results(messages)
    task_id, trial = run.get("task_id"), run.get("trial")
    keyed = all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in (task_id, trial))
    sid = f"{source.stem}:{task_id}:{trial}" if keyed else f"{source.stem}:{i}"
    missing = ([] if messages and messages[0].get("role") == "system" else ["system_prompt"]) + ([] if tools else ["tools"])
    return session(sid, messages, tools, meta(
        FORMAT, source, where, original=originals(task_id=task_id, trial=trial, reward=run.get("reward")),
        missing=missing, supplied={"tools": tools_file} if tools else {}, dropped={"orphan_tool_results": orphans}))


def read(source: Source, options: Options) -> Iterator[dict]:
    tools_file = options.tools or tools_beside(source.path, domain_of(source.path))
    tools = load_tools_file(tools_file) if tools_file else None
    document = source.document()
    if not isinstance(document, list):
        raise source.error(f"the file is {kind(document)}, not a list of runs; expected tau-bench runs [{{\"task_id\", \"trial\", \"traj\": [OpenAI messages]}}, ...]")
    yield from each_record(document, lambda i, run: convert_run(i, run, source, tools, tools_file))
