"""Input files for the log importers that the public corpus holds only in part, built in the tests.

- otel-genai: the corpus has the semantic conventions' examples (examples-llm-calls.md: attribute
  tables and the JSON values of gen_ai.input.messages / output.messages), not an OTLP export. The
  builder turns every attribute table into a span and writes OTLP JSON, with the message-valued
  attributes either as JSON text (stringValue) or structured (arrayValue / kvlistValue). Each
  example section is its own trace (the spec reuses one trace id for alternative presentations of
  one call); an "Event:" table becomes an event of the span before it; the multimodal input and
  output examples (JSONC, no table) become one more call.
- openai-batch: the corpus has an input file only; the builder writes its output file in the
  documented envelope, lines in reverse order (completion order is not input order).
- vllm-log: nothing is in the corpus; the builder writes a log in the documented format
  (vllm/entrypoints/serve/utils/request_logger.py) with token ids of the bundled model's tokenizer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .conftest import SESSIONS_PUBLIC

# ---------------------------------------------------------------------------------------------
# otel-genai: the spec's examples as OTLP JSON


def _jsonc(text: str):
    return json.loads("\n".join(line.split("//")[0] if line.lstrip().startswith("//") or " // " in line else line for line in text.splitlines()))


def _blocks_by_anchor(md: str) -> dict[str, object]:
    """<span id="anchor"> ... ```json VALUE ``` -> {anchor: VALUE}."""
    out = {}
    for m in re.finditer(r'<span id="([^"]+)">.*?```json\n(.*?)\n```', md, re.S):
        out[m.group(1)] = json.loads(m.group(2))
    return out


def _cell(value: str, anchors: dict):
    value = value.strip()
    link = re.fullmatch(r"\[`[^`]+`\]\(#([^)]+)\)", value)
    if link:
        return anchors[link.group(1)]
    tick = re.fullmatch(r"`(.*)`", value)
    return json.loads(tick.group(1)) if tick else value


def spec_calls(md_path: Path | None = None) -> list[dict]:
    """[{"section", "trace", "name", "span_id", "attributes", "events"}] for every table of the examples."""
    md = (md_path or SESSIONS_PUBLIC / "otel-genai" / "examples-llm-calls.md").read_text()
    anchors = _blocks_by_anchor(md)
    calls: list[dict] = []
    section, label, table = "", "", []
    sections = 0  # a running number: each example section is its own trace

    def close_table():
        nonlocal table
        if not table:
            return
        rows = {}
        for line in table[2:]:  # header and the ---- line first
            cells = [c for c in line.strip().strip("|").split("|")]
            if len(cells) >= 2:
                key = cells[0].strip().strip("`")
                rows[key] = _cell("|".join(cells[1:]), anchors)
        table = []
        attrs = {k: v for k, v in rows.items() if k.startswith("gen_ai.")}
        if label == "Event:" and calls:
            calls[-1]["events"].append({"name": "gen_ai.client.inference.operation.details", "attributes": attrs})
            return
        calls.append({"section": section, "trace": f"{sections:032x}",
                      "name": rows.get("Span name", "chat"), "span_id": f"{len(calls) + 1:016x}", "attributes": attrs, "events": []})

    for line in md.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        close_table()
        if line.startswith("#"):
            section, label, sections = line.lstrip("#").strip(), "", sections + 1
        elif line.strip() in ("Span:", "Event:") or line.startswith("**"):
            label = line.strip()
    close_table()
    # The multimodal examples have no table: one more call with their values.
    inputs = re.search(r"### Multimodal inputs example\n+```jsonc\n(.*?)\n```", md, re.S)
    outputs = re.search(r"### Multimodal output example\n+```jsonc\n(.*?)\n```", md, re.S)
    calls.append({"section": "Multimodal chat completion", "trace": f"{999:032x}", "name": "chat gpt-4", "span_id": f"{999:016x}",
                  "attributes": {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4",
                                 "gen_ai.input.messages": _jsonc(inputs.group(1)), "gen_ai.output.messages": _jsonc(outputs.group(1))},
                  "events": []})
    return calls


def any_value(value, structured: bool) -> dict:
    """A Python value as OTLP AnyValue; lists and objects as JSON text unless `structured`."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if value is None:
        return {}
    if not structured and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return {"stringValue": json.dumps(value)}
    if isinstance(value, list):
        return {"arrayValue": {"values": [any_value(v, True) for v in value]}}
    return {"kvlistValue": {"values": [{"key": k, "value": any_value(v, True)} for k, v in value.items()]}}


def otlp_export(calls: list[dict], structured: bool) -> dict:
    spans = []
    for k, c in enumerate(calls):
        spans.append({"traceId": c["trace"], "spanId": c["span_id"], "name": c["name"], "kind": 3,
                      "startTimeUnixNano": str(1_700_000_000_000_000_000 + k * 10), "endTimeUnixNano": str(1_700_000_000_000_000_000 + k * 10 + 5),
                      "attributes": [{"key": key, "value": any_value(v, structured)} for key, v in c["attributes"].items()],
                      "events": [{"name": e["name"], "timeUnixNano": str(1_700_000_000_000_000_000 + k * 10 + 4),
                                  "attributes": [{"key": key, "value": any_value(v, structured)} for key, v in e["attributes"].items()]}
                                 for e in c["events"]]})
    return {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "spec-examples"}}]},
                               "scopeSpans": [{"scope": {"name": "semantic-conventions examples"}, "spans": spans}]}]}


def write_otel_samples(directory: Path) -> list[Path]:
    """The spec's examples as two OTLP files: message attributes as JSON text, and structured."""
    calls = spec_calls()
    out = []
    for structured in (False, True):
        path = directory / f"spec-examples-{'structured' if structured else 'text'}.json"
        path.write_text(json.dumps(otlp_export(calls, structured), indent=1))
        out.append(path)
    return out


# ---------------------------------------------------------------------------------------------
# openai-batch: the sample input's output file

BATCH_INPUT = "openai-batch/batch_job_results_furniture.jsonl"


def batch_answer(custom_id: str) -> str:
    return f"Hello! ({custom_id})"


def write_batch_output(path: Path, failed: tuple[str, ...] = ()) -> Path:
    """The output of the sample batch, in completion order (reversed), `failed` custom_ids as errors."""
    lines = []
    for raw in (SESSIONS_PUBLIC / BATCH_INPUT).read_text().splitlines():
        if not raw.strip():
            continue
        cid = json.loads(raw)["custom_id"]
        if cid in failed:
            lines.append({"id": f"batch_req_{cid}", "custom_id": cid, "response": None,
                          "error": {"code": "server_error", "message": "the model is overloaded"}})
            continue
        lines.append({"id": f"batch_req_{cid}", "custom_id": cid, "error": None, "response": {
            "status_code": 200, "request_id": f"req_{cid}",
            "body": {"id": f"chatcmpl-{cid}", "object": "chat.completion", "model": "gpt-4o-mini-2024-07-18",
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": batch_answer(cid)}, "finish_reason": "stop"}]}}})
    path.write_text("".join(json.dumps(line) + "\n" for line in reversed(lines)))
    return path


# ---------------------------------------------------------------------------------------------
# vllm-log: a server log in the documented format

PREFIX = "(APIServer pid=4242) {level} 05-12 10:00:0{n} [logger.py:43] "
SAMPLING = ("SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.05, temperature=0.6, "
            "top_p=0.95, top_k=20, min_p=0.0, seed=None, stop=[], stop_token_ids=[], bad_words=[], thinking_token_budget=None, "
            "include_stop_str_in_output=False, ignore_eos=False, max_tokens=512, min_tokens=0, logprobs=None, prompt_logprobs=None, "
            "skip_special_tokens=True, spaces_between_special_tokens=True, structured_outputs=None, extra_args=None)")


def vllm_request_lines(rid: str, prompt_text: str, prompt_ids: list[int], output_ids: list[int], output_text: str,
                       sampling: str = SAMPLING, model: str = "Qwen/Qwen3.5-27B", n: int = 0) -> list[str]:
    """The five lines vLLM logs for one non-streaming request (DEBUG, --enable-log-requests --enable-log-outputs)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "..."}], "max_tokens": 512})
    return [
        PREFIX.format(level="DEBUG", n=n) + f"Request {rid} details: prompt: {prompt_text!r}, prompt_token_ids: {prompt_ids}, prompt_embeds shape: None.",
        PREFIX.format(level="INFO", n=n) + f"Received request {rid}: params: {sampling}, lora_request: None.",
        PREFIX.format(level="DEBUG", n=n) + f"Request {rid} JSON body: {body}",
        PREFIX.format(level="DEBUG", n=n) + f"Generated response {rid} details: output_token_ids: {output_ids}",
        PREFIX.format(level="INFO", n=n) + f"Generated response {rid}: output: {output_text!r}, finish_reason: stop",
    ]


def bundled_conversation_ids(tokenizer) -> list[tuple[str, list[int], list[int], str]]:
    """Two requests of one agent conversation, as a Qwen-style server renders and samples them:
    (prompt text, prompt ids, output ids with the end-of-turn token, output text) each; the second
    prompt extends the first prompt + output + a tool result."""
    messages = [{"role": "system", "content": "You list files."}, {"role": "user", "content": "What is here?"}]
    answers = ["I will look.\n<tool_call>\n<function=ls>\n</function>\n</tool_call>", "Two files: a and b."]
    out = []
    for k, answer in enumerate(answers):
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        output_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
        out.append((prompt, prompt_ids, output_ids, answer))
        messages = messages + [{"role": "assistant", "content": answer}, {"role": "user", "content": "a\nb"}]
    return out
