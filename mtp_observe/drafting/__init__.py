"""The drafting stage: drafts turned into acceptance rows, one per (anchor, depth) — ACCEPTANCE.md.

Contract: `acceptance` plans the anchors of a request's spans and turns the head's drafts and the target's
reductions into rows (`request_rows`); `drafters/` are the model-free proposers (n-gram, suffix decoding) and their
hybrids; `tree` and `tree_acceptance` grow and verify SGLang's tree drafts; `layer_rules` and `head_variants` replay
a multi-layer head's rules beside the chain; `whatif_heads` re-runs the head at other precisions; `grammar` runs the
recorded tool calls through their grammar (xgrammar, optional: forced tokens, drafts the grammar forbids, the grammar
drafters' proposals). Every variant
writes rows of the same columns (`columns` holds their shared sentinels), so the report reads them with one code.
"""
