"""The run stage: the replay and generate pipelines, from sessions to a run directory (or an output file).

Contract: `pipeline.replay(inputs, model_dir, out, opts)` writes a run directory (PRODUCT.md's contract;
`tables` holds it: the contract, the tables built, atomic writes, the lock — `schema` its Parquet columns, `entries`
the directory's entries, `readers` the tables read back; `parts` the per-session part files; `manifest` run.json's
life and the run's identity); `options` resolves what the flags ask for; `requests` replays one request and one
session into rows; `estimate` prices the work (`estimate_terms` what the options add beside
the base: what-if heads, thresholds, trees) and `progress` shows it; `shards`, `merge`, `ranks` and `cluster` take a
replay past one process (scheduler arrays, torchrun, Ray); `generation` and `decoding` are `generate` (the target's
own completions), `served` its completions from a running vLLM server (`--engine vllm`). `memory` measures a command's peak RSS for tests and benchmarks.
"""
