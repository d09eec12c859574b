"""The engines stage: the run as a serving engine would count it, the files engines read, and their counters checked.

Contract: `numbers.engine_numbers(report, k)` is the run at draft length K as vLLM counts it (over the simulated
decode's steps); `exports` writes vLLM, SGLang, TensorRT-LLM, speculation-profile and aiconfigurator inputs (it
follows the verdict); `counters` reads an engine's own counters (Prometheus text, per-request JSON, SGLang logs) and
checks they are counts; `check` compares them with the run (`mtp-observe compare`). Imports no torch.
"""
