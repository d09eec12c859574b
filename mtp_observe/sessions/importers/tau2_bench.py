"""tau2-bench: simulation files (sierra-research/tau2-bench, `data/simulations/*.json`).

Input: one JSON document `{"info": {..., "environment_info": {"domain_name", "policy",
"tool_defs"}}, "tasks": [...], "simulations": [{"id", "task_id", "trial", "messages": [...]}]}`.
Messages are tau2's own: assistant/user `{"role", "content", "tool_calls": [{"id", "name",
"arguments": {...}, "requestor"}], "raw_data": {"message": {..., "reasoning_content"}}}`, tool
`{"role": "tool", "id", "content", "requestor"}`, and (older files) multi-tool messages
`{"role": "tool", "tool_messages": [...]}`. One simulation -> one session, seen from the agent.

Mapping decisions:
- The agent's view: the simulated user's own tool calls (`requestor == "user"`, dual-control
  domains such as telecom) and their results are dropped and counted
  (`dropped.user_tool_calls`, `dropped.user_tool_results`); a user message left with no text is
  dropped too. User messages keep only their text (the user simulator's reasoning is not the
  agent's context).
- Reasoning: `raw_data.message.reasoning_content` (or `reasoning`) of each assistant message,
  also under `raw_data.choices[0].message`. Assistant turns without `raw_data` (tau2's fixed
  greeting "Hi! How can I help you today?") are kept: the agent saw them, with no reasoning.
- System prompt: the simulation files do not hold it. It is tau2's agent prompt template — a
  file `agent_system_prompt_template.txt` beside the input, or `--system-template FILE` — with
  `{domain_policy}` replaced by `info.environment_info.policy`. Without a template, or without a
  policy, it is recorded missing. A simulation that starts with its own system message keeps it.
- Tool schemas: `info.environment_info.tool_defs` when the file has them (a list of OpenAI
  schemas, or a {name: schema} map), else `--tools FILE`, else a `tools_<domain>.openai.json` /
  `tools_<domain>.json` beside the input, else recorded missing.
- Tool calls become OpenAI calls with object arguments; tool results are `tool` messages whose
  `tool_call_id` is the tau2 tool message `id`.
- Sampling: the agent's `info.agent_info.llm_args` (temperature, ...) -> meta.sampling under vLLM's
  names (common.py); the user simulator's own are not the agent's.
- id: the simulation id (a UUID); `<file stem>:<index>` when absent. `original` keeps the
  simulation id, task_id, trial, termination_reason, reward and the agent's model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .common import (
    Malformed,
    Options,
    Source,
    as_dict,
    as_list,
    as_str,
    check_tools,
    drop_orphan_results,
    each_record,
    file_beside,
    kind,
    load_tools_file,
    meta,
    objects,
    originals,
    sampling_params,
    session,
    tools_beside,
)

FORMAT = "tau2-bench"
TEMPLATE_NAME = "agent_system_prompt_template.txt"
POLICY_SLOT = "{domain_policy}"


def detect(document) -> bool:
    return isinstance(document, dict) and isinstance(document.get("simulations"), list)


def _reasoning(raw, where: str) -> str | None:
    """The assistant's reasoning from litellm's raw response (a choice, or a whole response)."""
    if not isinstance(raw, dict):
        return None
    message = raw.get("message")
    if message is None and isinstance(raw.get("choices"), list) and raw["choices"] and isinstance(raw["choices"][0], dict):
        message = raw["choices"][0].get("message")
    if not isinstance(message, dict):
        return None
    for key in ("reasoning_content", "reasoning"):
        if message.get(key) is not None:
            return as_str(message[key], f"{where}.raw_data.message.{key}")
    return None


def _calls(calls, where: str, counts: dict) -> list[dict]:
    out = []
    for w, call in objects(calls, where):
        if call.get("requestor", "assistant") == "user":
            counts["user_tool_calls"] += 1
            continue
        name = as_str(call.get("name"), f"{w}.name")
        args = call.get("arguments", {})
        if not isinstance(args, (dict, str)):
            raise Malformed(f"{w}.arguments", f"must be an object, not {type(args).__name__}")
        out.append({"id": call.get("id"), "type": "function", "function": {"name": name, "arguments": args}})
    return out


def _tool_results(m: dict, where: str, counts: dict) -> list[dict]:
    singles = [(where, m)] if "tool_messages" not in m else [
        (f"{where}.tool_messages[{k}]", t) for k, t in enumerate(as_list(m["tool_messages"], f"{where}.tool_messages"))]
    out = []
    for w, t in singles:
        t = as_dict(t, w)
        if t.get("requestor", "assistant") == "user":
            counts["user_tool_results"] += 1
            continue
        out.append({"role": "tool", "tool_call_id": t.get("id"), "content": as_str(t.get("content"), f"{w}.content", optional=True)})
    return out


def convert_messages(raw_messages, where: str, counts: dict) -> list[dict]:
    messages: list[dict] = []
    for w, m in objects(raw_messages, where):
        role = m.get("role")
        if role == "tool":
            messages.extend(_tool_results(m, w, counts))
            continue
        content = as_str(m.get("content"), f"{w}.content", optional=True)
        if role == "assistant":
            msg = {"role": "assistant", "content": content}
            reasoning = _reasoning(m.get("raw_data"), w)
            if reasoning is not None:
                msg["reasoning_content"] = reasoning
            if m.get("tool_calls"):
                calls = _calls(m["tool_calls"], f"{w}.tool_calls", counts)
                if calls:
                    msg["tool_calls"] = calls
            messages.append(msg)
        elif role == "user":
            if m.get("tool_calls"):
                counts["user_tool_calls"] += sum(1 for _ in as_list(m["tool_calls"], f"{w}.tool_calls"))
                if not (content or "").strip():
                    counts["user_tool_call_messages"] += 1
                    continue
            messages.append({"role": "user", "content": content})
        elif role == "system":
            messages.append({"role": "system", "content": content})
        else:
            raise Malformed(f"{w}.role", f"must be system, user, assistant or tool, not {role!r}")
    return messages


def _tool_defs(defs, where: str) -> list[dict] | None:
    """environment_info.tool_defs: a list of OpenAI schemas or {name: schema}; None when absent."""
    if defs is None:
        return None
    items = list(defs.values()) if isinstance(defs, dict) else defs
    tools = [t if isinstance(t, dict) and "function" in t else {"type": "function", "function": t} for t in as_list(items, where)]
    return check_tools(tools, where) or None


def convert_simulation(i: int, sim, source: Source, env: "Environment") -> dict:
    """Pure: simulation i -> one canonical session, seen from the agent."""
    where = f"simulations[{i}]"
    sim = as_dict(sim, where)
    counts = {"user_tool_calls": 0, "user_tool_results": 0, "user_tool_call_messages": 0}
    messages = convert_messages(sim.get("messages"), f"{where}.messages", counts)
    messages, orphans = drop_orphan_results(messages)
    supplied: dict = {}
    has_own_system = bool(messages) and messages[0]["role"] == "system"
    if env.system is not None and not has_own_system:
        messages.insert(0, {"role": "system", "content": env.system})
        supplied["system_prompt"] = env.template_file
    tools = env.file_tools or env.tools
    if tools and not env.file_tools:
        supplied["tools"] = env.tools_file
    missing = ([] if has_own_system or env.system is not None else ["system_prompt"]) + ([] if tools else ["tools"])
    sim_id = sim.get("id")
    sid = sim_id if isinstance(sim_id, str) and sim_id else f"{source.stem}:{i}"
    reward = sim["reward_info"].get("reward") if isinstance(sim.get("reward_info"), dict) else None
    return session(sid, messages, tools, meta(
        FORMAT, source, where, missing=missing, supplied=supplied,
        original=originals(simulation_id=sim_id, task_id=sim.get("task_id"), trial=sim.get("trial"),
                           termination_reason=sim.get("termination_reason"), reward=reward, agent_llm=env.agent_llm),
        dropped={**counts, "orphan_tool_results": orphans}, sampling=env.sampling))


@dataclass(frozen=True)
class Environment:
    """What every simulation of a file shares: its system prompt and tool schemas, and whence."""

    system: str | None
    template_file: Path | None
    file_tools: list[dict] | None  # environment_info.tool_defs
    tools: list[dict] | None  # --tools or a tools file beside the input
    tools_file: Path | None
    agent_llm: object
    sampling: dict  # meta.sampling: the agent's llm_args


def environment(document, template: str | None, template_file: Path | None, tools, tools_file) -> Environment:
    """Pure: the file-level parts of a parsed simulation file (raises Malformed)."""
    info = as_dict(document.get("info", {}), "info")
    env = as_dict(info.get("environment_info", {}), "info.environment_info")
    policy = as_str(env.get("policy"), "info.environment_info.policy", optional=True)
    agent = info.get("agent_info")
    system = template.replace(POLICY_SLOT, policy) if template is not None and policy is not None else None
    llm_args = agent.get("llm_args") if isinstance(agent, dict) else None
    sampling = sampling_params(llm_args, "info.agent_info.llm_args") if isinstance(llm_args, dict) else {}
    return Environment(system, template_file if system is not None else None, _tool_defs(env.get("tool_defs"), "info.environment_info.tool_defs"),
                       tools, tools_file, agent.get("llm") if isinstance(agent, dict) else None, sampling)


def read(source: Source, options: Options) -> Iterator[dict]:
    template_file = options.system_template or file_beside(source.path, [TEMPLATE_NAME])
    template = None
    if template_file is not None:
        t = Source(template_file)
        t.check_file()
        template = t.text()
    document = source.document()
    hint = "; expected a tau2-bench simulation file {\"info\", \"simulations\": [{\"id\", \"messages\"}]}"
    if not isinstance(document, dict):
        raise source.error(f"the file is {kind(document)}, not an object{hint}")
    env = document.get("info", {}).get("environment_info") if isinstance(document.get("info"), dict) else None
    domain = env.get("domain_name") if isinstance(env, dict) else None
    tools_file = options.tools or tools_beside(source.path, domain)
    tools = load_tools_file(tools_file) if tools_file else None
    try:
        shared = environment(document, template, template_file, tools, tools_file)
        simulations = as_list(document.get("simulations"), "simulations")
    except Malformed as e:
        raise source.error(f"{e}{hint}")
    yield from each_record(simulations, lambda i, sim: convert_simulation(i, sim, source, shared))
