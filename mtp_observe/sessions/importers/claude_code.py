"""claude-code: Claude Code session transcripts (`~/.claude/projects/<project>/<session>.jsonl`).

Input: one event per line, read as a stream. Message events are `{"type": "user"|"assistant",
"sessionId", "uuid", "parentUuid", "isSidechain", "message": {Anthropic message}}`; other
events (`queue-operation`, `summary`, `system`, `file-history-snapshot`, `progress`, ...)
carry no conversation. Claude Code writes an assistant response one content block per line:
the lines of one response share `message.id`. Tool results come back as `tool_result` blocks
in user lines. One file -> one session (or one per compaction part, below).

Mapping decisions:
- Assistant lines sharing `message.id` are merged into one assistant message, in line order,
  as long as only tool results came between them; a block repeated verbatim under the same id
  (older versions rewrote the message so far) is kept once. Blocks: `text` -> content,
  `thinking` -> `reasoning_content` (the signature is dropped), `tool_use` -> an OpenAI tool call
  with `input` as the arguments object. Several text (or thinking) blocks of one message are
  joined with a blank line; the order of text against tool calls is OpenAI's (text first).
- User lines: a string content, or `text` blocks, become a user message (hook feedback and
  other `isMeta` lines included: the model read them); each `tool_result` block becomes a
  `tool` message with `tool_call_id` = `tool_use_id` and its text content.
- Dropped and counted in `meta.dropped`: sidechain events (sub-agent conversations,
  `sidechain_events`), events that are not messages (`non_message_events`), synthetic
  assistant messages Claude Code writes itself (model `<synthetic>`, API errors:
  `synthetic_messages`), `redacted_thinking` blocks (encrypted; nothing to render),
  image/document blocks (`media_blocks`), other block types such as server tools
  (`unsupported_blocks`), and tool results with no preceding call (`orphan_tool_results`).
- Events are taken in file order; parentUuid branches (a rewound conversation) are not
  resolved. A `compact_boundary` system event ends a part: the model did not see the turns
  before it afterwards, so each part is its own session, ids `<sessionId>#1`, `#2`, ...
- Claude Code does not log its system prompt or tool schemas: both are recorded missing unless
  `--tools FILE` supplies schemas.
- id: the `sessionId` of the first message event, else the file stem. `original` keeps
  session_id, the Claude Code version and the model of the first assistant message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

from .common import (
    Malformed,
    Options,
    Source,
    as_dict,
    as_list,
    as_str,
    drop_orphan_results,
    join_text,
    load_tools_file,
    meta,
    originals,
    session,
    user_messages,
)

FORMAT = "claude-code"
EVENT_KEYS = ("sessionId", "uuid", "parentUuid", "leafUuid")


def detect_event(event) -> bool:
    """A Claude Code event: a `type` and Claude Code's own bookkeeping keys."""
    return isinstance(event, dict) and isinstance(event.get("type"), str) and any(k in event for k in EVENT_KEYS) \
        and "messages" not in event


class _Part:
    """The session being built between compaction boundaries."""

    def __init__(self):
        self.messages: list[dict] = []
        self.first_line: int | None = None
        self.last_line: int | None = None
        self.open: dict | None = None  # the assistant message that later lines with its id extend
        self.open_id = None
        self.open_blocks: list = []
        self.dropped = {"sidechain_events": 0, "non_message_events": 0, "synthetic_messages": 0,
                        "redacted_thinking_blocks": 0, "media_blocks": 0, "unsupported_blocks": 0}

    def touch(self, n: int) -> None:
        self.first_line = n if self.first_line is None else self.first_line
        self.last_line = n

    def close(self) -> None:
        self.open, self.open_id, self.open_blocks = None, None, []

    # -- assistant ------------------------------------------------------------------------------

    def assistant(self, message: dict, where: str) -> None:
        mid = message.get("id")
        if self.open is None or mid is None or mid != self.open_id:
            self.open = {"role": "assistant", "content": "", "_texts": [], "_thinking": []}
            self.open_id = mid if isinstance(mid, str) else None
            self.open_blocks = []
            self.messages.append(self.open)
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else as_list(content, f"{where}.content")
        for k, block in enumerate(blocks):
            w = f"{where}.content[{k}]"
            block = as_dict(block, w)
            if block in self.open_blocks:
                continue
            self.open_blocks.append(block)
            kind = block.get("type")
            if kind == "text":
                self.open["_texts"].append(as_str(block.get("text"), f"{w}.text"))
            elif kind == "thinking":
                self.open["_thinking"].append(as_str(block.get("thinking"), f"{w}.thinking"))
            elif kind == "redacted_thinking":
                self.dropped["redacted_thinking_blocks"] += 1
            elif kind == "tool_use":
                args = block.get("input", {})
                if not isinstance(args, dict):
                    raise Malformed(f"{w}.input", f"must be an object, not {type(args).__name__}")
                call = {"id": as_str(block.get("id"), f"{w}.id"), "type": "function",
                        "function": {"name": as_str(block.get("name"), f"{w}.name"), "arguments": args}}
                self.open.setdefault("tool_calls", []).append(call)
            else:
                self.dropped["unsupported_blocks"] += 1
        self.open["content"] = join_text(self.open["_texts"])
        if self.open["_thinking"]:
            self.open["reasoning_content"] = join_text(self.open["_thinking"])

    # -- user -----------------------------------------------------------------------------------

    def user(self, message: dict, where: str) -> None:
        for m in user_messages(message.get("content"), where, self.dropped):
            if m["role"] == "user":
                self._user_text([m["content"]])
            else:
                self.messages.append(m)

    def _user_text(self, texts: list[str]) -> None:
        self.close()
        self.messages.append({"role": "user", "content": join_text(texts)})

    def finish(self) -> tuple[list[dict], int]:
        for m in self.messages:
            m.pop("_texts", None)
            m.pop("_thinking", None)
        return drop_orphan_results(self.messages)


def convert(events: Iterable[tuple[int, object]], source: Source, tools: list[dict] | None = None,
            tools_file: Path | None = None) -> Iterator[dict]:
    """Pure: (line number, event) pairs, in order -> canonical sessions (one per compaction part)."""
    info: dict = {}
    part, number, any_messages = _Part(), 0, False

    def emit(last: bool):
        messages, orphans = part.finish()
        sid = info.get("session_id") or source.stem
        sid = sid if last and number == 1 else f"{sid}#{number}"
        return session(sid, messages, tools, meta(
            FORMAT, source, f"lines {part.first_line}-{part.last_line}",
            original=originals(**info, part=number if not (last and number == 1) else None),
            missing=["system_prompt"] + ([] if tools else ["tools"]),
            supplied={"tools": tools_file} if tools else {},
            dropped={**part.dropped, "orphan_tool_results": orphans}))

    for n, event in events:
        where = f"line {n}"
        event = as_dict(event, where)
        kind = event.get("type")
        if kind == "system" and event.get("subtype") == "compact_boundary":
            if part.messages:
                number += 1
                yield emit(last=False)
                part = _Part()
            continue
        if kind not in ("user", "assistant"):
            part.dropped["non_message_events"] += 1
            continue
        if event.get("isSidechain") is True:
            part.dropped["sidechain_events"] += 1
            continue
        message = as_dict(event.get("message"), f"{where}.message")
        if not info and isinstance(event.get("sessionId"), str):
            info["session_id"] = event["sessionId"]
            info["version"] = event.get("version")
        part.touch(n)
        any_messages = True
        if kind == "assistant":
            if message.get("model") == "<synthetic>" or event.get("isApiErrorMessage") is True:
                part.dropped["synthetic_messages"] += 1
                continue
            if "model" not in info and isinstance(message.get("model"), str):
                info["model"] = message["model"]
            part.assistant(message, f"{where}.message")
        else:
            part.user(message, f"{where}.message")
    if not any_messages:
        raise Malformed("", "no user or assistant message events (is this a Claude Code transcript?)")
    if part.messages:
        number += 1
        yield emit(last=True)


def read(source: Source, options: Options) -> Iterator[dict]:
    tools = load_tools_file(options.tools) if options.tools else None
    try:
        yield from convert(source.lines(), source, tools, options.tools)
    except Malformed as e:
        raise source.error(f"{e}; expected Claude Code transcript events, one JSON object per line")
