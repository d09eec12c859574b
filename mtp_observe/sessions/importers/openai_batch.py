"""openai-batch: OpenAI Batch API input JSONL joined with its output JSONL by custom_id.

Input: the batch's input file — one request per line, `{"custom_id", "method": "POST", "url",
"body"}` — and its output file(s), one result per line, `{"id", "custom_id", "response":
{"status_code", "request_id", "body"}, "error"}` (OpenAI's `batch_<id>_output.jsonl`, and what
`vllm run-batch` writes). Give them together (`import openai-batch input.jsonl output.jsonl`, or a
directory holding both): `import_files` tells output files by their lines and hands them to every
input file of the run; both are streamed, and the output lines are held in memory by custom_id.

Mapping decisions:
- One input line + the output line with its custom_id is one session (a batch has no
  conversation ids: each line stands alone); the output's order is completion order, not input
  order, so lines are joined by custom_id, never by position. Sessions follow the input order.
- `body` is a Chat Completions request (openai-chat's conversion, chat.py) or, when `url` is
  `/v1/responses`, a Responses request (openai-responses' conversion); the output's
  `response.body` is its response.
- A failed request — `error` set, `response` null, or a `status_code` other than 200 — is dropped
  and counted (`failed_requests`), as is an input line with no output line (`requests_without_output`,
  e.g. a batch that expired part-way); neither is an error.
- Sampling comes from the input `body` (the output echoes none): vLLM's names (common.py),
  max_completion_tokens -> max_tokens.
- An input file with no output file at all is refused: there is no assistant turn to score.
- id: the custom_id, else `<file stem>:<line>`. `original` keeps custom_id, the batch request's
  `id` and `response.request_id`, and the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from . import chat, openai_responses
from .common import Dropped, Malformed, Options, Rejected, Source, as_dict, as_str, originals

FORMAT = "openai-batch"


def is_input_line(obj) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("custom_id"), str) and isinstance(obj.get("body"), dict) and "url" in obj


def is_output_line(obj) -> bool:
    return (isinstance(obj, dict) and isinstance(obj.get("custom_id"), str) and "body" not in obj
            and ("response" in obj or "error" in obj))


def outputs(paths: tuple[Path, ...]) -> dict[str, tuple[str, dict]]:
    """custom_id -> (where, output line) over every output file; a custom_id twice is an InputError."""
    index: dict[str, tuple[str, dict]] = {}
    for path in paths:
        source = Source(path)
        for n, obj in source.lines():
            if not is_output_line(obj):
                raise source.error(f"line {n}: not a Batch output line {{\"custom_id\", \"response\", \"error\"}}; "
                                   "an output file holds only output lines")
            where = f"{source.name} line {n}"
            if obj["custom_id"] in index:
                raise source.error(f"line {n}: custom_id {obj['custom_id']!r} is also at {index[obj['custom_id']][0]}; "
                                   "give each batch's output once")
            index[obj["custom_id"]] = (where, obj)
    return index


def _failed(result: dict) -> bool:
    response = result.get("response")
    return result.get("error") is not None or not isinstance(response, dict) or response.get("status_code", 200) != 200


def convert_line(n: int, line, found: dict) -> chat.Conversation | Dropped:
    """Pure: input line n (and the output lines by custom_id) -> a Conversation, or why it is not one."""
    where = f"line {n}"
    line = as_dict(line, where)
    custom_id = as_str(line.get("custom_id"), f"{where}.custom_id")
    body = as_dict(line.get("body"), f"{where}.body")
    url = line.get("url") if isinstance(line.get("url"), str) else ""
    if custom_id not in found:
        return Dropped("requests_without_output")
    _, result = found[custom_id]
    if _failed(result):
        return Dropped("failed_requests")
    reply = result["response"].get("body")
    if url.rstrip("/").endswith("/responses"):
        conv = openai_responses.request(body, reply, where, n, {})
    else:
        conv = chat.request(body, reply, where, n)
    conv.original = {**conv.original, **originals(custom_id=custom_id, batch_request_id=result.get("id"),
                                                  request_id=result["response"].get("request_id"))}
    return conv


def read(source: Source, options: Options) -> Iterator:
    if not options.batch_outputs:
        raise source.error("a Batch input file with no output file; give the output file too "
                           "(mtp-observe import openai-batch INPUT.jsonl OUTPUT.jsonl): the answers are only there")
    found = outputs(options.batch_outputs)
    for n, line in source.lines():
        if not is_input_line(line):
            yield Rejected(f"line {n}: not a Batch input line {{\"custom_id\", \"method\", \"url\", \"body\"}}")
            continue
        try:
            item = convert_line(n, line, found)
        except Malformed as e:
            yield Rejected(str(e))
            continue
        if isinstance(item, Dropped):
            yield item
            continue
        custom_id = item.original["custom_id"]
        yield chat.to_session(item, FORMAT, source, custom_id or f"{source.stem}:{n}", options)
