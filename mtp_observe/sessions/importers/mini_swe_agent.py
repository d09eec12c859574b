"""mini-swe-agent: trajectory files (`<instance_id>.traj.json`, trajectory_format "mini-swe-agent-1").

Input: one JSON document `{"info": {"exit_status", "submission", "config", ...}, "messages":
[...], "trajectory_format", "instance_id"}`. Messages are OpenAI-style `{"role", "content"}`:
the system prompt, the task as a user message, then assistant turns whose action is a bash
block in the text ("THOUGHT: ...\\n\\n```bash\\ncmd\\n```") and user messages holding the
observation. Assistant messages carry the provider's raw response in
`extra.response.choices[0].message`. One file -> one session.

Mapping decisions:
- Actions stay in the assistant text: the model generated them as text (bash blocks), not as
  tool calls, so there are no tool schemas to miss. Later formats that log real tool calls
  (`tool_calls` on assistant messages, `tool` results) pass through in OpenAI form; then the
  schemas, which the file does not hold, are recorded missing.
- Reasoning: `extra.response.choices[0].message.reasoning_content` or `.reasoning`, else the
  text of its `reasoning_details` of type "reasoning.text" (OpenRouter). Gemini 3 returns
  reasoning on the first turn (sometimes the first two) and none after; each turn keeps what its
  own response held, nothing is carried over.
- `exit` messages (the agent's final status in newer formats) are not model turns: dropped and
  counted (`dropped.exit_messages`).
- The system prompt is the file's system message; without one it is recorded missing.
- Sampling: `info.config.model.model_kwargs` (litellm's call arguments: temperature, top_p, ...)
  -> meta.sampling under vLLM's names (common.py).
- id: `instance_id`, else the file name without `.traj.json`. `original` keeps instance_id,
  exit_status, trajectory_format and the model name from `info.config.model.model_name`.
"""

from __future__ import annotations

from typing import Iterator

from .common import (
    Malformed,
    Options,
    Source,
    as_dict,
    as_str,
    drop_orphan_results,
    join_text,
    meta,
    objects,
    originals,
    sampling_params,
    session,
)

FORMAT = "mini-swe-agent"
MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


def detect(document) -> bool:
    if not isinstance(document, dict) or not isinstance(document.get("messages"), list):
        return False
    fmt = document.get("trajectory_format")
    return isinstance(fmt, str) and fmt.startswith("mini-swe-agent")


def _reasoning(extra, where: str) -> str | None:
    """Reasoning from the raw provider response kept in a message's `extra`."""
    if not isinstance(extra, dict) or not isinstance(extra.get("response"), dict):
        return None
    choices = extra["response"].get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    if not isinstance(message, dict):
        return None
    w = f"{where}.extra.response.choices[0].message"
    for key in ("reasoning_content", "reasoning"):
        if message.get(key) is not None:
            return as_str(message[key], f"{w}.{key}")
    details = message.get("reasoning_details")
    if isinstance(details, list):
        texts = [d["text"] for d in details if isinstance(d, dict) and d.get("type") == "reasoning.text" and isinstance(d.get("text"), str)]
        if texts:
            return join_text(texts)
    return None


def convert(document, source: Source) -> dict:
    """Pure: the parsed trajectory -> one canonical session."""
    document = as_dict(document, "the file")
    exits = 0
    messages = []
    for w, m in objects(document.get("messages"), "messages"):
        if m.get("role") == "exit":
            exits += 1
            continue
        out = {k: m[k] for k in MESSAGE_KEYS if k in m and m[k] is not None}
        if m.get("role") == "assistant":
            reasoning = m.get("reasoning_content")
            reasoning = as_str(reasoning, f"{w}.reasoning_content") if reasoning is not None else _reasoning(m.get("extra"), w)
            if reasoning is not None:
                out["reasoning_content"] = reasoning
        messages.append(out)
    messages, orphans = drop_orphan_results(messages)
    info = document.get("info") if isinstance(document.get("info"), dict) else {}
    model = info.get("config", {}).get("model", {}) if isinstance(info.get("config"), dict) else {}
    instance_id = document.get("instance_id")
    sid = instance_id if isinstance(instance_id, str) and instance_id else source.stem
    has_calls = any(m.get("tool_calls") for m in messages if m.get("role") == "assistant")
    kwargs = model.get("model_kwargs") if isinstance(model, dict) else None
    sampling = sampling_params(kwargs, "info.config.model.model_kwargs") if isinstance(kwargs, dict) else {}
    missing = ([] if messages and messages[0].get("role") == "system" else ["system_prompt"]) + (["tools"] if has_calls else [])
    return session(sid, messages, None, meta(
        FORMAT, source, "the file", missing=missing, supplied={},
        original=originals(instance_id=instance_id, exit_status=info.get("exit_status"),
                           trajectory_format=document.get("trajectory_format"),
                           model=model.get("model_name") if isinstance(model, dict) else None),
        dropped={"exit_messages": exits, "orphan_tool_results": orphans}, sampling=sampling))


def read(source: Source, options: Options) -> Iterator[dict]:
    try:
        yield convert(source.document(), source)
    except Malformed as e:
        raise source.error(f"{e}; expected a mini-swe-agent trajectory {{\"messages\": [...], \"info\": {{...}}}}")
