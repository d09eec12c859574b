"""generate --engine vllm: a running vLLM server samples the target's own completions (mtp_observe/run/served.py).

Here, fast: the option's refusals (one line, exit 2, nothing written) and the client against a stand-in server that
answers as vLLM's OpenAI API does (GET /version, GET /v1/models, POST /v1/completions with `return_token_ids`), so
that what generate sends and writes is pinned. The real vLLM server is tests/engine/test_generate_engine.py.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mtp_observe.run.decoding import turn_seed

SESSIONS = [
    {"id": "s0", "messages": [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi"},
                              {"role": "user", "content": "and now?"}, {"role": "assistant", "content": "now this"}]},
    {"id": "s1", "messages": [{"role": "user", "content": "one more"}, {"role": "assistant", "content": "sure"}]},
]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "mtp_observe", *map(str, args)], capture_output=True, text=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StandIn:
    """vLLM's answers, as vllm/entrypoints/openai/completion/protocol.py shapes them; each completion is the
    prompt's last two ids then the request's first stop token id (finish_reason "stop"). `echo`: the prompt ids it
    says it completed (None: the ones sent)."""

    def __init__(self, echo=None):
        self.requests: list[dict] = []
        self.echo = echo
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, body: dict):
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/version":
                    self._send({"version": "0.32.0"})
                elif self.path == "/v1/models":
                    self._send({"object": "list", "data": [{"id": "served-model", "root": "/models/x"}]})
                else:
                    self.send_error(404)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stand_in.requests.append(body)
                prompt = body["prompt"]
                tokens = [prompt[-1], prompt[-2], body["stop_token_ids"][0]]
                self._send({"model": body["model"], "choices": [{
                    "index": 0, "text": "", "finish_reason": "stop", "token_ids": tokens,
                    "prompt_token_ids": stand_in.echo if stand_in.echo is not None else prompt}]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sessions(tmp_path) -> Path:
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in SESSIONS))
    return path


@pytest.fixture
def stand_in():
    server = StandIn()
    yield server
    server.close()


def _one_line_refusal(done, *needles):
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    for needle in needles:
        assert needle in done.stderr, done.stderr


def test_generate_engine_vllm_with_no_server_at_the_url_is_one_line_and_writes_nothing(tiny_checkpoint, sessions, tmp_path):
    url = f"http://127.0.0.1:{_free_port()}"  # bound and let go: nothing listens there
    out = tmp_path / "own.jsonl"
    done = run_cli("generate", sessions, "-o", out, "--model", tiny_checkpoint, "--engine", "vllm", "--engine-url", url)
    _one_line_refusal(done, f"--engine-url {url}: no vLLM server answers there", "start one")
    assert not out.exists() and not out.with_name("own.jsonl.partial").exists()


@pytest.mark.parametrize("args, needle", [
    (["--engine", "vllm"], "--engine vllm needs --engine-url URL"),
    (["--engine-url", "http://127.0.0.1:9"], "--engine-url applies to --engine vllm"),
    (["--engine", "sglang"], "--engine sglang: expected one of transformers, vllm"),
    (["--engine", "vllm", "--engine-url", "127.0.0.1:8000"], "expected the server's http:// or https:// address"),
    (["--engine", "vllm", "--engine-url", "http://127.0.0.1:9", "--speculative", "3"], "drop --speculative"),
    (["--engine", "vllm", "--engine-url", "http://127.0.0.1:9", "--dtype", "float32"], "drop --dtype"),
])
def test_the_engine_options_refuse_what_cannot_work_in_one_line(tiny_checkpoint, sessions, tmp_path, args, needle):
    done = run_cli("generate", sessions, "-o", tmp_path / "own.jsonl", "--model", tiny_checkpoint, *args)
    _one_line_refusal(done, needle)


def test_a_served_generate_writes_what_the_server_returned_with_the_engine_and_sampler_in_meta(
        tiny_checkpoint, sessions, tmp_path, stand_in):
    out = tmp_path / "own.jsonl"
    done = run_cli("generate", sessions, "-o", out, "--model", tiny_checkpoint, "--engine", "vllm", "--engine-url",
                   stand_in.url + "/v1", "--sampling", "instruct_general", "--max-new-tokens", 7, "--batch-size", 2)
    assert done.returncode == 0, done.stderr
    assert "the server's own seed, by vLLM at" in done.stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    sent = {tuple(r["prompt"]): r for r in stand_in.requests}
    assert len(sent) == 3 == sum(len(r["requests"]) for r in records)
    for record in records:
        meta = record["meta"]
        assert meta["generated"]["engine"] == {"name": "vllm", "version": "0.32.0", "model": "served-model",
                                               "root": "/models/x"}
        assert meta["generated"]["dtype"] is None and meta["generated"]["device"] is None
        assert meta["generated"]["stop"] == ["eos"] * len(record["requests"])
        assert meta["sampling"] == {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0, "presence_penalty": 1.5,
                                    "frequency_penalty": 0.0, "repetition_penalty": 1.0, "seed": None, "max_tokens": 7}
        for request in record["requests"]:
            body = sent[tuple(request["prompt_token_ids"])]
            prompt = request["prompt_token_ids"]
            assert request["completion_token_ids"] == [prompt[-1], prompt[-2], body["stop_token_ids"][0]]
            assert body["model"] == "served-model" and body["max_tokens"] == 7 and body["return_token_ids"] is True
            assert {k: body[k] for k in meta["sampling"] if k not in ("seed", "max_tokens")} == \
                {k: v for k, v in meta["sampling"].items() if k not in ("seed", "max_tokens")}
            assert "seed" not in body  # the server's own generator (vLLM-CPU refuses per-request seeds)
    # the output is a replay input: `sessions` reads every request back
    listed = run_cli("sessions", out, "--model", tiny_checkpoint, "--no-estimate")
    assert listed.returncode == 0, listed.stderr


def test_a_given_seed_is_each_requests_own_turn_seed(tiny_checkpoint, sessions, tmp_path, stand_in):
    out = tmp_path / "own.jsonl"
    done = run_cli("generate", sessions, "-o", out, "--model", tiny_checkpoint, "--engine", "vllm", "--engine-url",
                   stand_in.url, "--sampling", "greedy", "--seed", 5)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    seeds = {tuple(r["prompt"]): r["seed"] for r in stand_in.requests}
    for record in records:
        assert record["meta"]["sampling"]["seed"] == 5
        for request, turn in zip(record["requests"], record["meta"]["generated"]["turns"]):
            assert seeds[tuple(request["prompt_token_ids"])] == turn_seed(5, record["id"], turn)


def test_a_server_that_completed_other_prompt_tokens_is_refused(tiny_checkpoint, sessions, tmp_path):
    server = StandIn(echo=[1, 2, 3])
    try:
        done = run_cli("generate", sessions, "-o", tmp_path / "own.jsonl", "--model", tiny_checkpoint, "--engine",
                       "vllm", "--engine-url", server.url)
    finally:
        server.close()
    _one_line_refusal(done, "the server completed other prompt tokens than the ones sent (3 for")
