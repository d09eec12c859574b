"""Runs in the engine's own virtualenv (scripts/engine_venv.sh), never imported by the project's tests.

    <engine-python> engine_driver.py JOB.json OUT.json

JOB: {"model": dir, "k": int, "method": "mtp" | "ngram" | ..., "speculative": {more speculative_config keys}?,
      "seed": int, "prompts": [[token ids]], "max_model_len": int, "engine": {more vllm.LLM keyword arguments}?,
      "exposition": bool? (each run also carries "metrics_text": the Prometheus text of vLLM's registry after it,
      what /metrics would serve, counters cumulative over the process's runs),
      "runs": [{"name": str, "temperature": float, "top_p": float, "top_k": int, "max_tokens": int}]}
OUT: {"vllm": version, "fixes": [...], "load_s": float,
      "runs": [{"name", "seconds", "outputs": [{"token_ids", "finish_reason"}], "counters": {...}}]}

One offline engine (vllm.LLM) generates every run's completions of the prompts, in order; each run's counters are
the difference of vLLM's own Prometheus counters (LLM.get_metrics) across it. The engine settings are the ones the
CPU build needs (docs/engine-fidelity.md): text only, no prefix caching, bf16, one engine-wide seed.
The engine starts its core with spawn, hence the __main__ guard.
"""

import json
import sys
import time

COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def counters(llm, k: int) -> dict:
    got = {name: 0 for name in COUNTERS}
    per_pos = [0] * k
    for m in llm.get_metrics():
        if m.name in got:
            got[m.name] += int(m.value)
        elif m.name == PER_POS:
            for i, v in enumerate(m.values[:k]):
                per_pos[i] += int(v)
    return {"num_drafts": got[COUNTERS[0]], "num_draft_tokens": got[COUNTERS[1]],
            "num_accepted_tokens": got[COUNTERS[2]], "num_accepted_tokens_per_pos": per_pos}


def minus(a: dict, b: dict) -> dict:
    return {key: ([x - y for x, y in zip(a[key], b[key])] if isinstance(a[key], list) else a[key] - b[key]) for key in a}


def main(job_path: str, out_path: str) -> None:
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with open(job_path) as f:
        job = json.load(f)
    k = job["k"]
    started = time.time()
    llm = LLM(model=job["model"], dtype="bfloat16", seed=job["seed"], max_model_len=job["max_model_len"],
              language_model_only=True, enable_prefix_caching=False, disable_log_stats=False,
              gpu_memory_utilization=job.get("memory_fraction", 0.1),  # on CPU: the fraction of RAM reserved
              speculative_config={"method": job["method"], "num_speculative_tokens": k, **job.get("speculative", {})},
              **job.get("engine", {}))
    load_s = time.time() - started
    prompts = [TokensPrompt(prompt_token_ids=p) for p in job["prompts"]]
    runs = []
    for run in job["runs"]:
        params = SamplingParams(temperature=run["temperature"], top_p=run["top_p"], top_k=run["top_k"],
                                max_tokens=run["max_tokens"])
        before = counters(llm, k)
        t0 = time.time()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.time() - t0
        runs.append({"name": run["name"], "seconds": seconds, "counters": minus(counters(llm, k), before),
                     "outputs": [{"token_ids": list(o.outputs[0].token_ids), "finish_reason": o.outputs[0].finish_reason}
                                 for o in outs]})
        if job.get("exposition"):
            import prometheus_client
            runs[-1]["metrics_text"] = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    try:
        from mtp_observe_vllm_fixes import selected
        fixes = list(selected())
    except ImportError:
        fixes = None
    with open(out_path, "w") as f:
        json.dump({"vllm": vllm.__version__, "fixes": fixes, "load_s": load_s, "runs": runs}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
