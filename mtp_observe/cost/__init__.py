"""The cost stage: what a draft step and a verify step cost at a batch size, and the speedup they buy.

Contract: `geometry` counts the bytes and parameters a step reads (from a checkpoint's tensors or a config alone);
`roofline` prices a step on a named device from bytes and FLOPs; `probe` measures it on this device; `inventory`
is what `inspect` shows of the head; `speedup` is the formula, the best K and the engine schedule. Everything but
`probe` is pure Python and numpy, so the report (which imports no torch) prices a run from run.json alone. It comes
before `run` because a replay records the checkpoint's geometry and inventory in run.json.
"""
