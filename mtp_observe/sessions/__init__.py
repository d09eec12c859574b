"""The sessions stage: what was recorded, read once and rendered to exactly the tokens the target saw.

Contract: `reading` streams and validates canonical session JSONL (SESSIONS.md) into `Session`s (or `Skipped`
under --on-error skip); `inputs` is the one object a command builds from its input files — the sessions' ids and
indices, read once, and their renderings produced lazily and cached — that the shard plan, the manifest, the
estimate and the replay all take; `rendering` turns a session into requests (token ids, scored spans, segment
labels) with the checkpoint's chat template; `importers/` converts real agent logs into canonical sessions.
Nothing here loads model weights: only the tokenizer and the template.
"""
