"""Every family's chat template renders each turn as the engine saw it (issue 41).

The fixtures are tiny checkpoints whose tokenizers carry templates in the shapes of the released ones
(synthetic.CHAT_FORMATS: Qwen3.5 thinking on and off, DeepSeek-V3, DeepSeek-V3.1 thinking, DeepSeek-R1, GLM-4.5).
The check is a serve loop written here, independently of the renderer: at each turn it renders the prompt with the
template (as a server does), "generates" what a model of that family emits there — written out by hand in the
family's output format, token ids encoded alone (generation never merges across the prompt) plus the stop token the
engine stops on — parses the output back into an OpenAI message as the engine's reasoning and tool parsers do, and
appends it (and a tool result) to the conversation. Replaying the conversation must score exactly the generated ids
in exactly the prompt's context.
"""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
import torch

from mtp_observe.sessions.reading import read_sessions
from mtp_observe.sessions.rendering import Renderer
from mtp_observe.sessions.templates import TemplateOverrides

from .test_nextn import one_line, run_in_process

FAMILY = {"chatml": "qwen3_5", "deepseek_v3": "deepseek_v3", "deepseek_v31": "deepseek_v3",
          "deepseek_r1": "deepseek_v3", "glm4_5": "glm4_moe"}
TOOLS = [{"type": "function", "function": {"name": "get_order", "description": "Look up an order",
                                           "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}]
# What the model decides at each turn: (reasoning, content, tool call arguments or None); a tool call is answered
# with a tool result, a plain answer by the next user message.
PLAN = [("The user wants order 42, so I look it up.", "Let me look it up.", {"id": "42"}),
        ("It shipped.", "Order 42 has shipped.", None),
        ("Another lookup.", "Checking order 7.", {"id": "7"}),
        ("Pending.", "Order 7 is pending.", None)]
USERS = ["Where is order 42?", "Thanks, and order 7?"]
RESULTS = ['{"status": "shipped"}', '{"status": "pending"}']


def checkpoint(make_checkpoint, fmt: str):
    layout = "vlm" if fmt == "chatml" else "text"
    return make_checkpoint(family=FAMILY[fmt], layout=layout, chat_format=fmt)


def renderer(directory, kwargs=None) -> Renderer:
    return Renderer.from_model_dir(directory, overrides=TemplateOverrides(kwargs=kwargs or {}))


# --- the serve loop: each family's output format, written out -------------------------------------------------


def output_text(fmt: str, thinking: bool, prompt: str, reasoning: str, content: str, args) -> str:
    """What a model of the family generates after `prompt` (before its stop token), as text."""
    call = None
    if fmt == "chatml":
        if args is not None:
            call = ("\n\n" if content else "") + "<tool_call>\n<function=get_order>\n" + "".join(
                f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items()) + "</function>\n</tool_call>"
        head = f"{reasoning}\n</think>\n\n" if thinking else ""  # the prompt holds "<think>\n" (and, off, its close)
        return head + content + (call or "")
    if fmt == "glm4_5":
        if args is not None:
            call = "\n<tool_call>get_order" + "".join(f"\n<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>"
                                                      for k, v in args.items()) + "\n</tool_call>"
        head = f"\n<think>{reasoning}</think>" if thinking else ""  # off: the prompt holds "\n<think></think>"
        return head + "\n" + content + (call or "")
    after_tool = not prompt.endswith(("<｜Assistant｜>", "<think>", "<think>\n", "</think>"))
    if fmt == "deepseek_v31":
        if args is not None:
            call = f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_order<｜tool▁sep｜>{json.dumps(args)}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        head = f"{reasoning}</think>" if thinking and not after_tool else ""
        return head + content + (call or "") + "<｜end▁of▁sentence｜>"
    # DeepSeek-V3 and R1: tool calls as a fenced JSON block; after tool results the model closes them itself
    if args is not None:
        call = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_order\n```json\n"
                f"{json.dumps(args)}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    head = "<｜tool▁outputs▁end｜>" if after_tool else (f"{reasoning}\n</think>\n\n" if fmt == "deepseek_r1" else "")
    return head + content + (call or "") + "<｜end▁of▁sentence｜>"


def parse(fmt: str, text: str) -> dict:
    """The engine's reasoning and tool parsers: generated text -> an OpenAI assistant message."""
    message = {"role": "assistant"}
    text = text.replace("<｜end▁of▁sentence｜>", "").replace("<｜tool▁outputs▁end｜>", "")
    if "</think>" in text:
        reasoning, text = text.split("</think>", 1)
        message["reasoning_content"] = reasoning.replace("<think>", "").strip()
    calls = []
    if fmt == "chatml":
        for name, body in re.findall(r"<tool_call>\n<function=(\w+)>\n(.*?)</function>\n</tool_call>", text, re.S):
            calls.append((name, dict(re.findall(r"<parameter=(\w+)>\n(.*?)\n</parameter>", body, re.S))))
        text = text.split("<tool_call>")[0]
    elif fmt == "glm4_5":
        for name, body in re.findall(r"<tool_call>(\w+)(.*?)\n</tool_call>", text, re.S):
            calls.append((name, dict(re.findall(r"<arg_key>(.*?)</arg_key>\n<arg_value>(.*?)</arg_value>", body, re.S))))
        text = text.split("<tool_call>")[0]
    else:
        for name, args in re.findall(r"<｜tool▁call▁begin｜>(?:function<｜tool▁sep｜>)?(\w+)(?:<｜tool▁sep｜>|\n```json\n)(.*?)(?:\n```)?<｜tool▁call▁end｜>", text, re.S):
            calls.append((name, json.loads(args)))
        text = text.split("<｜tool▁calls▁begin｜>")[0]
    message["content"] = text.strip() or None
    if calls:
        message["tool_calls"] = [{"id": f"call_{n}", "type": "function",
                                  "function": {"name": name, "arguments": args}}  # an object, as vLLM hands templates
                                 for n, (name, args) in enumerate(calls)]
    return message


def serve(directory, fmt: str, thinking: bool, kwargs: dict) -> tuple[dict, list[tuple[list[int], list[int]]]]:
    """The session a server would log, and for each assistant turn (prompt ids, generated ids incl. the stop)."""
    tok = renderer(directory).tokenizer
    ids_of = tok.convert_tokens_to_ids
    messages = [{"role": "system", "content": "You are a support agent."}, {"role": "user", "content": USERS[0]}]
    turns = []
    for n, (reasoning, content, args) in enumerate(PLAN):
        prompt = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True, **kwargs)
        text = output_text(fmt, thinking, prompt, reasoning, content, args)
        generated = tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
        if fmt == "glm4_5":  # the implicit end: the model emits the next role token (the first end id at the end)
            last = n == len(PLAN) - 1
            generated.append(ids_of("<|endoftext|>" if last else "<|observation|>" if args else "<|user|>"))
        elif fmt == "chatml":
            generated.append(ids_of("<|im_end|>"))
        turns.append((tok.backend_tokenizer.encode(prompt, add_special_tokens=False).ids, generated))
        message = parse(fmt, tok.decode(generated[:-1] if fmt in ("glm4_5", "chatml") else generated))
        assert message["content"] == content and (message.get("tool_calls") is not None) == (args is not None)
        messages.append(message)
        if args is not None:
            messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": RESULTS[n // 2]})
        elif n + 1 < len(PLAN):
            messages.append({"role": "user", "content": USERS[1]})
    return {"id": f"{fmt}-served", "messages": messages, "tools": TOOLS}, turns


CASES = [("chatml", True, {}), ("chatml", False, {"enable_thinking": False}), ("deepseek_v3", False, {}),
         ("deepseek_v31", True, {"thinking": True}), ("deepseek_v31", False, {}), ("deepseek_r1", True, {}),
         ("glm4_5", True, {}), ("glm4_5", False, {"enable_thinking": False})]


@pytest.mark.parametrize("fmt,thinking,kwargs", CASES,
                         ids=[f"{f}-{'thinking' if t else 'plain'}" for f, t, _ in CASES])
def test_every_scored_span_is_exactly_what_the_serve_loop_generated_in_exactly_its_prompt(
        make_checkpoint, tmp_path, fmt, thinking, kwargs):
    d = checkpoint(make_checkpoint, fmt)
    session, turns = serve(d, fmt, thinking, kwargs)
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(session) + "\n")
    rendered = renderer(d, kwargs).render(next(iter(read_sessions([path]))))
    spans = [(r, sp) for r in rendered.requests for sp in r.spans]
    assert len(spans) == len(PLAN)
    for (request, span), (prompt, generated) in zip(spans, turns):
        assert request.input_ids[: span.start] == prompt, f"turn {span.turn}: the context differs"
        assert request.input_ids[span.start: span.end + 1] == generated, f"turn {span.turn}: the scored span differs"
        assert span.segments[-1] == 3 and sum(c == 3 for c in span.segments) == 1  # one end token, the last


def test_the_history_the_template_strips_starts_a_new_request_and_the_stripped_turn_is_scored_with_its_reasoning(
        make_checkpoint, tmp_path):
    """GLM-4.5 drops reasoning before the last user message: turn 4's prompt renders turn 2 without it, so turn 4
    cannot share turn 2's request — and turn 2 is still scored with the reasoning the model generated."""
    d = checkpoint(make_checkpoint, "glm4_5")
    session, _ = serve(d, "glm4_5", True, {})
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(session) + "\n")
    r = renderer(d)
    rendered = r.render(next(iter(read_sessions([path]))))
    assert [[sp.turn for sp in q.spans] for q in rendered.requests] == [[2, 4], [6, 8]]
    first, second = rendered.requests
    assert "<think>The user wants order 42" in r.tokenizer.decode(first.input_ids)
    assert "<think>The user wants order 42" not in r.tokenizer.decode(second.input_ids)  # history as rendered


def test_a_stop_token_is_the_next_messages_role_and_the_first_end_id_at_the_end(make_checkpoint, tmp_path):
    d = checkpoint(make_checkpoint, "glm4_5")
    session, _ = serve(d, "glm4_5", True, {})
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(session) + "\n")
    r = renderer(d)
    rendered = r.render(next(iter(read_sessions([path]))))
    stops = [r.tokenizer.convert_ids_to_tokens(q.input_ids[sp.end]) for q in rendered.requests for sp in q.spans]
    assert stops == ["<|observation|>", "<|user|>", "<|observation|>", "<|endoftext|>"]
    assert r.end_order[0] == r.tokenizer.convert_tokens_to_ids("<|endoftext|>")  # generation_config's first


def missing_reasoning_session(tmp_path, meta=None):
    session = {"id": "lost", "tools": TOOLS, "messages": [
        {"role": "user", "content": "Where is order 42?"},
        {"role": "assistant", "content": "It shipped.", "reasoning_content": "Look it up."},
        {"role": "user", "content": "And order 7?"},
        {"role": "assistant", "content": "Pending."}]}  # reasoning generated under thinking, not recorded
    if meta is not None:
        session["meta"] = meta
    path = tmp_path / "lost.jsonl"
    path.write_text(json.dumps(session) + "\n")
    return path


def test_reasoning_missing_under_a_thinking_prompt_is_one_line_naming_the_turn(make_checkpoint, tmp_path):
    d = checkpoint(make_checkpoint, "deepseek_v31")
    path = missing_reasoning_session(tmp_path)
    one_line(run_in_process("sessions", path, "--model", d, "--template-kwargs", '{"thinking": true}', "--no-estimate"),
             "session lost", "assistant message 3", "records no reasoning")
    # thinking off (the template's default): the same session renders whole
    code, out, err = run_in_process("sessions", path, "--model", d, "--no-estimate")
    assert code == 0, err


def test_on_error_skip_leaves_out_only_the_turn_that_cannot_be_reconstructed(make_checkpoint, tmp_path):
    d = checkpoint(make_checkpoint, "deepseek_v31")
    path = missing_reasoning_session(tmp_path)
    r = renderer(d, {"thinking": True})
    r.turn_errors = "skip"
    rendered = r.render(next(iter(read_sessions([path]))))
    assert [sp.turn for q in rendered.requests for sp in q.spans] == [1]
    assert [t for t, _ in rendered.skipped_turns] == [3] and "records no reasoning" in rendered.skipped_turns[0][1]
    code, out, err = run_in_process("sessions", path, "--model", d, "--template-kwargs", '{"thinking": true}',
                                    "--no-estimate", "--on-error", "skip")
    assert code == 0, err
    assert "assistant message 3" in err and "1 assistant turn left out" in err
    assert "thinking=true (--template-kwargs): 1 session" in out


def test_the_sessions_own_thinking_switch_is_used_and_said_and_the_option_overrides_it(make_checkpoint, tmp_path):
    d = checkpoint(make_checkpoint, "deepseek_v31")
    path = missing_reasoning_session(tmp_path, meta={"template_kwargs": {"thinking": True}})
    one_line(run_in_process("sessions", path, "--model", d, "--no-estimate"), "assistant message 3")
    code, out, err = run_in_process("sessions", path, "--model", d, "--template-kwargs", '{"thinking": false}',
                                    "--no-estimate")
    assert code == 0, err
    assert "thinking=false (--template-kwargs): 1 session" in out
    path.write_text(path.read_text().replace('"content": "Pending."}', '"content": "Pending.", "reasoning_content": "Hm."}'))
    code, out, err = run_in_process("sessions", path, "--model", d, "--no-estimate")
    assert code == 0, err
    assert "thinking=true (session meta): 1 session" in out


def test_reasoning_recorded_under_a_prompt_that_closes_the_block_is_refused_naming_the_turn(make_checkpoint, tmp_path):
    d = checkpoint(make_checkpoint, "glm4_5")
    path = missing_reasoning_session(tmp_path)
    one_line(run_in_process("sessions", path, "--model", d, "--template-kwargs", '{"enable_thinking": false}',
                            "--no-estimate"), "assistant message 1 records reasoning", "thinking off")


def test_show_prints_where_each_turn_starts_and_ends(make_checkpoint, tmp_path):
    d = checkpoint(make_checkpoint, "glm4_5")
    session, _ = serve(d, "glm4_5", True, {})
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(session) + "\n")
    code, out, err = run_in_process("sessions", path, "--model", d, "--show", session["id"])
    assert code == 0, err
    lines = out.splitlines()
    starts = [k for k, line in enumerate(lines) if line.startswith("turn ")]
    assert [lines[k].split(" ·")[0] for k in starts] == ["turn 2", "turn 4", "turn 6", "turn 8"]
    assert lines[starts[0]].endswith('"<|assistant|>"')  # the prompt ends at the assistant's role token
    assert '"<think>"' in lines[starts[0] + 1] and lines[starts[0] + 1].endswith('"<|observation|>"')
    assert lines[starts[-1] + 1].endswith('"<|endoftext|>"')


# --- acceptance: a DeepSeek-style and a GLM-style session replay, and the drafts are the NextN reference's ---------


@pytest.mark.parametrize("fmt,kwargs", [("deepseek_v31", {"thinking": True}), ("glm4_5", {})],
                         ids=["deepseek_v31-thinking", "glm4_5"])
def test_a_served_agent_session_replays_and_its_drafts_equal_the_nextn_reference(make_checkpoint, tmp_path, fmt,
                                                                                  kwargs):
    from mtp_observe.model.loading import load_model
    from mtp_observe.model.target import prefill_hidden

    from .reference_nextn import TransformersNextn

    d = checkpoint(make_checkpoint, fmt)
    session, turns = serve(d, fmt, True, kwargs)
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(session) + "\n")
    run = tmp_path / "run"
    code, _, err = run_in_process("replay", path, "--model", d, "--k", "2", "--device", "cpu", "--out", run,
                                  *(["--template-kwargs", json.dumps(kwargs)] if kwargs else []))
    assert code == 0, err
    requests = pd.read_parquet(run / "requests.parquet")
    rows = pd.read_parquet(run / "positions.parquet")
    scored = [list(req.input_ids)[int(sp["start"]): int(sp["end"]) + 1] for _, req in requests.iterrows() for sp in req.spans]
    assert scored == [g for _, g in turns]  # the rendered ids are the served ones
    model = load_model(d)
    reference = TransformersNextn(model)
    checked = 0
    for _, req in requests.iterrows():
        ids = torch.tensor(list(req.input_ids))
        hidden = prefill_hidden(model.target, ids, chunk_size=64)
        got = rows[rows.request == req.request].set_index(["pos", "depth"])
        for sp in req.spans:
            s, e = int(sp["start"]), int(sp["end"])
            for p in range(s, e, 3):  # every third anchor of every turn (the reference recomputes from scratch)
                drafts, _ = reference.draft(hidden, ids, p, min(2, e - p))
                for k, token in enumerate(drafts, start=1):
                    assert int(got.loc[(p, k)].draft_token) == token, (p, k)
                    checked += 1
    assert checked > 40


@pytest.mark.parametrize("fmt,kwargs", [("deepseek_v31", {"thinking": True}), ("glm4_5", {})],
                         ids=["deepseek_v31-thinking", "glm4_5"])
def test_generate_prompts_each_turn_as_the_server_did_and_its_output_replays_to_exactly_the_generated_ids(
        make_checkpoint, tmp_path, fmt, kwargs):
    """`generate` completes each turn from the prompt the serve loop rendered (the thinking prompt included), stops on
    the family's end ids, and replaying its records scores exactly the generated ids."""
    d = checkpoint(make_checkpoint, fmt)
    session, turns = serve(d, fmt, True, kwargs)
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(session) + "\n")
    out = tmp_path / "generated.jsonl"
    extra = ["--template-kwargs", json.dumps(kwargs)] if kwargs else []
    code, _, err = run_in_process("generate", path, "--model", d, "-o", out, "--max-new-tokens", "6", "--device", "cpu",
                                  "--sampling", "greedy", *extra)
    assert code == 0, err
    record = json.loads(out.read_text().splitlines()[0])
    kept = record["meta"]["generated"]["turns"]
    prompts = {turn: prompt for turn, (prompt, _) in zip([2, 4, 6, 8], turns)}
    assert kept and all(r["prompt_token_ids"] == prompts[t] for r, t in zip(record["requests"], kept))
    run = tmp_path / "run"
    code, _, err = run_in_process("replay", out, "--model", d, "--k", "2", "--device", "cpu", "--out", run)
    assert code == 0, err
    requests = pd.read_parquet(run / "requests.parquet")
    scored = [list(req.input_ids)[int(sp["start"]): int(sp["end"]) + 1] for _, req in requests.iterrows() for sp in req.spans]
    assert scored == [r["completion_token_ids"] for r in record["requests"]]


def test_a_replay_under_on_error_skip_records_the_turn_it_left_out_and_keeps_the_session(make_checkpoint, tmp_path):
    d = checkpoint(make_checkpoint, "deepseek_v31")
    path = missing_reasoning_session(tmp_path)
    run = tmp_path / "run"
    code, _, err = run_in_process("replay", path, "--model", d, "--k", "2", "--device", "cpu", "--out", run,
                                  "--template-kwargs", '{"thinking": true}', "--on-error", "skip")
    assert code == 0, err
    assert "sessions render with thinking=true (--template-kwargs), the first lost" in err  # the switch it used
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["counts"]["sessions_ok"] == 1 and manifest["counts"]["sessions_skipped"] == 0
    assert [(e["session_id"], e["turn"]) for e in manifest["errors"]] == [("lost", 3)]
    assert "records no reasoning" in manifest["errors"][0]["message"]
    requests = pd.read_parquet(run / "requests.parquet")
    assert [int(sp["turn"]) for _, req in requests.iterrows() for sp in req.spans] == [1]
    code, _, err = run_in_process("replay", path, "--model", d, "--k", "2", "--device", "cpu", "--out", tmp_path / "r2",
                                  "--template-kwargs", '{"thinking": true}')
    assert code == 2 and "assistant message 3" in err
