"""The model stage: what a checkpoint holds and how its parts run, exactly as the serving engines run them.

Contract: `checkpoint` reads a model directory from its headers alone (`CheckpointInfo`, no torch); `families`
holds each family as data (layouts, config keys, the head's geometry); `weights` reads tensors into torch at their
serving values; `target` runs the target's chunked prefill and reduces its logits (`penalties`: vLLM's penalties its sampler applies); `mtp/` is the draft head (the
row pass and the chain); `loading.load_model` puts target and head on one device and dtype. Numerics: `fp8`,
`quantisers`, `precisions`, `serving`; `routing` records the target's experts; `synthetic` writes tiny checkpoints in
the real layouts for tests; `hub` resolves a hub id from the local cache (never downloads); `engine_target` runs
the target's layers in a running vLLM server (`replay --target-engine`: its hidden states over HTTP and a shared file,
the embedding, final norm, lm_head and head here; never imports vLLM).
"""
