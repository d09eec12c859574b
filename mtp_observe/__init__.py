"""mtp-observe: replay recorded sessions through a Qwen3.5-family target, run its MTP draft head at
every position without committing anything, and report whether MTP speculative decoding pays.

The package is its stages, in pipeline order; a stage imports only the shared leaves and the stages
before it (tests/test_architecture.py checks it from the code's own imports):

    sessions   recorded conversations read once, validated, imported from real logs, rendered to token ids
    model      checkpoints, families, the target (transformers), the MTP head, numerics, loading
    drafting   drafts into rows: acceptance, the model-free drafters, trees, layer rules, what-if heads
    cost       what a draft step and a verify step cost (geometry, roofline, probe) and the speedup they buy
    run        the replay and generate pipelines: options, requests, parts, tables, manifest, shards, merge, Ray
    report     a run directory read back (no torch): tallies, the verdict, the serve flags, presentation
    engines    the engines' side: the numbers as an engine counts them, exports, its counters checked
    cli        the command line: option checks, one library call, printing

Shared leaves: errors (the exceptions a user can cause), literal (user text printed literally), wording
(counts in words), outputs (where a command may write, and the atomic write), jsonfiles (a JSON file read
as one object). The library API: docs/library.md.
"""

__version__ = "0.1.0"
