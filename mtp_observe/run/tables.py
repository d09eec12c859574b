"""The tables: the run directory's public contract (schema_version 5) and its atomic writing.

Contract (PRODUCT.md): a run directory holds

    run.json            the manifest (keys below)
    requests.parquet    one row per replayed request
    positions.parquet   one row per (anchor, depth) — per drafter and draft length in a run of several drafters
    .mtp-observe.lock   while a replay writes it: the lock file (below); removed when the replay ends

Both Parquet paths are datasets: a single file or a directory of part files. This tool
writes directories of parts, each holding a group of consecutive finished sessions (up to 256
sessions or 2,000,000 positions rows, or what a minute gathered; parts.py), named
`part-<index of its first session:08d>.parquet` in both tables; the name order is input order
(under torchrun each rank's parts hold its own sessions, a shard's its own, a Ray job's the sessions in the order
they finished; requests.parquet `session_index` holds the canonical order, version 3). Runs written before grouping hold one
session per part (and may carry `-r<rank>` names): they are read and resumed the same way, a part
of one session being a group of one. Each part is written under a dot-prefixed temporary name in
the run directory itself, outside the table directories
(`.positions.parquet.part-00000000.parquet.tmp-<pid>`), and renamed into place, so a table
directory only ever holds complete parts and a killed run leaves nothing there that a reader
would pick up: pyarrow.dataset, pandas, polars and duckdb all read such a run (tested with each;
polars refuses a directory holding a file of another extension, so a temporary inside it would
break polars). Rows are grouped by session in input order and, within a session, sorted by
(request, pos, depth) — by (drafter, draft_k, request, pos, depth) with drafters.

Its code is four modules, none importing torch (the report reads through them): schema.py the Parquet columns;
tables.py (this one) the tables built from rows and written atomically, run.json read and written, the lock,
--out checked (`prepare_run_directory`) and a resumed run's finished parts; entries.py the directory's entries
(names, temporaries, what --overwrite removes); readers.py the tables read back.

Schema history: version 2 added the recording-sampler sums (requests.parquet `fit`), the sampler
each session was scored with (`recorded_sampling`), the profiles' penalties and min-p, the
`recorded` and `greedy` profiles, and run.json's `recorded_with`, `model.generation_config`,
`model.max_position_embeddings`, `model.rope_scaling`; the report reads version 1 and says what it lacks.
Within version 2 (keys only added): every drafter on the same anchors — run.json `drafters` and `target_ran`,
positions.parquet `drafter` and `draft_k` (below). A run without them is an mtp-only run (`drafters` absent:
{"mtp"}, `target_ran` absent: true), so older version-2 and version-1 runs read as before.

Version 3 (this round's additions; keys only added, so version-2 and version-1 runs read as before, the report
noting what they lack: no head reading, no trees, no layer rules):
    head_reading        run.json: which engine's reading of the head the run replayed (`replay --head-reading`,
                        families.HeadReading): {"engine": "vllm" | "sglang", "engine_version", "zero_position_0_embedding",
                        "fed_back_state": "post_norm" | "pre_norm", "nextn_mlp": null | "by_layer_index" | "moe"};
                        null for a model-free replay. Part of the run's identity (--resume needs the same). A run
                        without it replayed a Qwen head, which vLLM and SGLang read alike
    model.head_copies   run.json: a NextN layer's copies of the target's embedding and lm_head compared with the
                        target's, {"embed_tokens.weight": "equal" | "differs" | "absent", "shared_head.head.weight":
                        ...}; null for a Qwen head (it ships none). The replay runs the target's either way, as both
                        engines do
    model.cost_geometry gains "kv_width" and "attention_width" (cost.Geometry; 0 for GQA: 2 · nkv · d and 2 · d)
    run.json `trees`        [{"name": "tree:S,TOPK,T" (",ancestors" for the true-ancestor what-if), "steps": S,
                            "topk": TOPK, "draft_tokens": T, "attention": "slot" | "ancestors"}]: `replay --tree`'s
                            SGLang configurations (tree.py), part of the run's identity; [] without --tree
    run.json `layer_rules`  [] for a one-layer head; for a head with several MTP layers [{"rule": "layer0",
                            "drafter": "mtp", "layers": L, "k": null}, {"rule": "stepwise", "drafter": "mtp:stepwise",
                            "layers": L, "k": min(Kmax, L)}] (layer_rules.py): the `mtp` rows are layer 0 at every
                            step, the `mtp:stepwise` rows layer i at step i+1
    positions.parquet       with trees or layer rules the run has the drafter columns even for mtp alone: each tree's
                            rows are a block with `drafter` = its name and `draft_k` = S (depths 1..min(S, e - p)), the
                            stepwise rule's a block with `drafter` = "mtp:stepwise" and `draft_k` = its k; a tree row's
                            draft_token, match, accepted, draft_logprob and p_accept_<profile> are defined in
                            tree_acceptance.py (the recorded continuation followed down the tree; p_accept the chance
                            the sampled rule leaves the on-path node for any of its kept children)
    tree_node               int8, null on rows that are not a tree's; only in runs with trees: why the recorded path
                            is where it is at that depth — 2 kept in the final tree, 1 grown but cut by the T-1 budget,
                            0 not among the expanded node's TOPK children, -1 its parent was never expanded (not in
                            its level's frontier), -2 the path left the grown tree at an earlier depth

Version 3, continued (the engines' defaults, docs/engine-fidelity.md; the report reads versions 1 and 2 with a note of what
they lack):
    positions.parquet `draft_len`   int8, with `drafter` and `draft_k`: the tokens the drafter's draft at the row's
                        anchor holds for its draft_k, counting those past the end of the turn (vLLM's num_draft_tokens
                        of a step there), the same on every row of the anchor; the engine-counted numbers count only
                        the steps with a draft (metrics.py). Without it a draft is read to end at the end of its turn.
    run.json drafters.NAME.runner   "v2" | "v1": the vLLM model runner whose rules the rows follow (mtp v2, ngram
                        --ngram-runner, suffix and the hybrids v1): the n-gram rule, and no min-p at a V1 drafter's
                        draft positions. Absent (older runs): ngram and suffix v1, mtp v2.
    run.json serving    {"device": --serve-device, "fp8_activations": "dynamic" | "none" | null (not block-FP8),
                        "top_k_ties": "index" | "all", "linears": {rule: how many block-FP8 linears follow it}}
                        (serving.py, fp8.py); part of the run's identity. Absent (older runs): weight-only block-FP8,
                        the PyTorch top-k (every tie kept), min-p at every draft position.

Version 5:
    positions.parquet `accepted_past_end`   int8, with the target's columns: 1 where the anchor's draft holds a
                        token just past the end of its turn (e - p < K; the head's chain is run on to it) and that
                        token is the target's argmax after the end-of-turn token, else 0; the same on every row of
                        the anchor (drafting/acceptance.py). vLLM counts such a draft as accepted before it trims the
                        tokens past the stop token, so the engine-counted numbers count it where the walk reaches the
                        end of the turn at that anchor (report/metrics.py decode_walk). Absent (older runs and
                        model-free replays, which have no target): 0.

Drafters (`replay --drafters mtp,ngram,suffix,hybrid,hybrid_longer`; drafters/roster.py):
    positions.parquet, when the run has any drafter besides mtp (an mtp-only run is written without them):
    drafter             dictionary<int8, string>: mtp | ngram | suffix | hybrid | hybrid_longer, one block of
                        rows per drafter, each with the same anchors and the definitions of ACCEPTANCE.md
                        (match, accepted, the target's columns where the target ran)
    draft_k             int8: the draft length K' the row's draft was made for (vLLM's num_speculative_tokens).
                        mtp and ngram: Kmax only (their draft at K is the first K tokens of the one at Kmax).
                        suffix, hybrid, hybrid_longer: K' = 1..Kmax, rows at depths 1..min(K', e - p) of the draft
                        made for K' — suffix decoding picks its match by a score that depends on K (and the
                        hybrids' threshold is K), so the draft at K' is not the Kmax draft cut at K'; the report's
                        τ_sim(K) walks the draft_k = K rows, its α_k / A_k / τ(K) read the draft_k = Kmax rows
    draft_token         -1 where the drafter proposes nothing at that depth (a proposal is a chain that stops):
                        match and accepted false, target_logprob NaN, every p_accept_<profile> 0
    draft_logprob       the head's log-prob where the head's draft is the row's (mtp; a hybrid that took it),
                        NaN for a model-free draft (ngram, suffix; a hybrid that took suffix's)
    target columns      target_token, target_logprob, actual_logprob and p_accept_<profile> are absent when no
                        target ran: a replay whose drafters are all model-free (ngram, suffix) loads no weights
run.json:
    drafters            {name: parameters, "runner" (v3), "draft_k": [K' its rows are written for]}, --drafters
                        order: ngram {"prompt_lookup_min", "prompt_lookup_max", "max_model_len", "runner"}; suffix {"max_tree_depth",
                        "max_cached_requests", "max_spec_factor", "max_spec_offset", "min_token_prob",
                        "max_model_len"}; hybrid {"policy", "suffix": {..., "max_spec_tokens"}}; hybrid_longer
                        {"policy", "suffix"}; mtp {}. Part of the run's identity (--resume needs the same)
    target_ran          false for a model-free replay: then sampling is {}, dtype null, device "cpu",
                        model.head_tensors / weights_fingerprint / numerics / roofline / roofline_by_precision
                        null (no weights were read), requests.parquet `fit` holds only "tokens" per span and
                        `recorded_sampling` is null
    timing.drafting     {part: {"seconds", "anchors"}}: CPU time the model-free drafters spent proposing in this
                        run (parts: ngram, suffix, suffix_hybrid — the hybrid's deeper suffix tree) and the anchors
                        they proposed at (a resumed run counts what it drafted itself)
    counts.anchors      anchors per drafter (every drafter drafts at the same ones); counts.rows: every drafter's
Added within version 2 (optional keys; a run without them reads as before): requests.parquet `routing`
and run.json `model.cost_geometry`, for the speedup by batch size (cost.py).

Version 3, continued (past one machine: shards, merge, Ray; docs/scale.md):
    requests.parquet `session_index`  int64: the session's index in the input stream (0-based, skipped inputs
                        counted): the canonical session order. The report orders sessions by it (report/run.py), so a
                        run whose parts group sessions otherwise — torchrun ranks, shards merged, a Ray job's
                        completion order — reports exactly as one process reading the input in order. A version-2 run
                        has none: its sessions are read in the order its parts list them (input order for one process)
    run.json `shard`    null, or the shard this run replayed (`replay --shard I/N`; shards.py): {"index", "count", "by"
                        ("id" | "tokens"), "rule" (the assignment rule in words), "input_set" (sha256 of every input's
                        label and content, in order: shards.input_set), "sessions" (how many it owns), "session_ids"
                        (their ids — or <path>:<line> for an input line with no readable id — in input order),
                        "tokens" (the tokens rule only)}. Part of the run's identity (--resume needs the same)
    run.json `merged`   a run written by `mtp-observe merge` (merge.py): {"count", "by", "rule", "input_set", "shards":
                        [{"path", "index", "status", "created", "finished", "sessions_ok", "world_size", "timing"}],
                        "linked" / "copied" (part files), "missing": null, or (--allow-partial) {"shards": [indices not
                        given], "sessions": [ids owned by a given shard but not in its parts], "unknown": [shard indices
                        whose own list is not known]}}; status "complete", or "partial" (--allow-partial with something
                        missing: the verdict is UNRELIABLE)
    run.json `cluster`  a run replayed on Ray (`replay --ray`; cluster.py): {"engine": "ray", "address", "replicas",
                        "gpus_per_replica", "max_attempts", "replaced" (replicas that died and were replaced),
                        "retried" (sessions given to another replica after theirs died)}
    run.json `errors`   each entry may carry "index" (the input index, for merge's order), and (v4) "turn": then it is one
                        assistant turn left out under --on-error skip (a turn the rendering cannot reconstruct,
                        sessions/rendering.TurnError), not a skipped session

Version 3, continued (what-ifs from one replay, docs/whatifs.md; every addition optional, so a version-2 or version-1 run is
read as before and lacks only what it never asked for):
    positions.parquet `head_precision`
                        dictionary<int8, string>, written when `replay --head-precision` ran: null on the rows of the
                        head as served, else the precision (bf16 | fp8 | int8 | nvfp4 | q8_0 | q6_k | q4_k) whose head
                        drafted the row. Each precision's rows are the mtp head's at draft_k = Kmax (drafter mtp in a
                        run of drafters) on the same anchors, with every column of the served rows (the target's too:
                        the same reduction scores them); they come after the served rows, each precision's block in
                        --head-precision order. A reader that wants what is served filters head_precision IS NULL
    positions.parquet `draft_confidence`
                        float64, written when `replay --draft-p-min` ran: on the head's rows (served and what-if), the
                        probability llama.cpp compares with --draft-p-min — the head's softmax at temperature 1 over its
                        ten largest logits, at its draft (mtp/head.py); NaN on other drafters' rows
    run.json `whatifs`  null, or {"head_precision": [names], "draft_p_min": [thresholds]}: part of the run's identity
                        (--resume needs the same); counts.rows counts every precision's rows too
    run.json `model.head_precisions`
                        null, or {precision: {"formats": {head tensor: format or null (kept as loaded)}, "embedding",
                        "lm_head" (their formats), "fallbacks" (GGUF types llama-quantize would fall back from, in
                        words), "head_dense_bytes", "head_expert_bytes", "lm_head_bytes", "embedding_row_bytes" (what
                        a draft step reads at that precision: cost.Geometry's head fields), "draft_step_bytes" (a
                        batch-1 draft step: dense + top-k experts + lm_head), "draft_cost" (its bytes over a batch-1
                        target step's as served)}} (precisions.py)

run.json keys:
    schema_version      4 (version-1, -2 and -3 runs are read too; they lack the keys marked "v2" / "Version 3" / "v4": among them
                        model.weights_fingerprint, model.generation_config_sha256, options.device_map; the what-if keys
                        are optional in version 3 too)
    tool                {"name": "mtp-observe", "version": str}
    created, finished   ISO-8601 UTC strings (finished null while running)
    status              "running" | "complete" | "failed"
    model               {"path", "bundled": bool, "model_type", "config_sha256", "head_tensors": [names],
                         "numerics": what the weights were computed in (e.g. "fp8 e4m3 weights (128x128 blocks,
                                     q * weight_scale_inv) dequantised to bfloat16"; added in schema 2),
                         "weights_fingerprint": {"method", "sha256", "bytes", "files", ...}  (checkpoint.py; v2),
                         "generation_config_sha256": str | null  (v2),
                         "roofline": {"precision", "head_bytes", "lm_head_bytes", "target_bytes", "draft_cost",
                                      "head_step_bytes", "target_step_bytes" (batch-1 step bytes: routed experts
                                      at top-k / E; added in schema 2)},
                         "roofline_by_precision": {precision: draft_cost},
                         "cost_geometry": optional, the roofline's numbers (cost.Geometry: bytes and parameters by
                                          what a step reads, attention and Gated DeltaNet dimensions), so the
                                          report computes speedup by batch size without the checkpoint}
    tokenizer_sha256    str
    target_engine       v4, optional (absent or null: the target's layers ran here): {"engine": "vllm", "version",
                        "model"}: the engine server that ran them (`replay --target-engine URL`, docs/engine-target.md);
                        the rows are the same columns either way, so the report reads such a run as any other
    k                   Kmax replayed (int)
    dtype, device       str
    sampling            {profile: {"temperature", "top_p", "top_k", "min_p", "presence_penalty",
                         "frequency_penalty", "repetition_penalty"}} (vLLM SamplingParams names), one
                         p_accept_<profile> column each; "recorded" also has "per_session": true and
                         "fallback" (the sampler of sessions without their own meta.sampling: the
                         declared one, "generation_config" or "vllm_defaults")
    recorded_with       v2: null, or the profile name `replay --recorded-with` declared
    model.generation_config         v2: the checkpoint's generation_config.json sampler (as vLLM reads it), or null
    model.max_position_embeddings   v2: the text config's, or null
    model.rope_scaling              v2: the text config's rope parameters when they scale (rope_type other than
                                    "default", or a factor), else null
    inputs              [{"path", "sha256", "sessions"}]   path "-" for standard input (its sha256 is of what was read)
    rendering           v2: null, or {"chat_template": {"path", "sha256"} | null, "template_kwargs": {...}}: what
                        --chat-template / --template-kwargs replaced (part of the run's identity: --resume needs the same)
    options             {"chunk_size", "on_error", "max_sessions", "device_map", ...}
    counts              {"sessions_ok", "sessions_skipped", "requests", "tokens_replayed",
                         "scored_tokens", "anchors", "rows", "max_request_tokens"}
    versions            {"python", "torch", "transformers"}
    errors              [{"path", "line", "session_id", "message"}]   skipped inputs and why
    timing              {"wall_s", "tokens_per_s"}

requests.parquet columns added in version 2:
    fit                 list<struct>, one per entry of `spans` (same order): "tokens" int32 (scored
                        tokens x_t, t = s..e, t >= 1), and per profile P "support_P" int32 (tokens with
                        q_t(x_t) > 0), "q_P" double (Σ q_t(x_t)), "q2_P" double (Σ_t Σ_v q_t(v)²),
                        "var_P" double (Σ_t Σ_v q_t(v)³ - (Σ_v q_t(v)²)²), "ll_P" double (Σ log q_t(x_t)
                        over the tokens with q_t(x_t) > 0), q_t the profile's sampler at t on the
                        recorded prefix (ACCEPTANCE.md, "The recording sampler")
    recorded_sampling   struct: "source" ("session": its meta.sampling, or the fallback named in
                        run.json sampling.recorded) and the seven parameters the `recorded` profile used
    speculative         struct or null: what `generate --speculative K` recorded for the request (its session's
                        meta.speculative; null for any other): "k" int32 (the loop's K), "anchors" list<int32> (each
                        verify step's anchor p, an index into input_ids), "accepted" list<int32> (the drafts the step
                        kept, 0..k); the report sets the loop's tokens per step beside the replay's τ_sim (added
                        within version 2: a run without the column has no loop to compare)
    routing             optional (written only for a target with MoE routers; absent otherwise and in
                        runs written before it): struct "q_max" int32, "layers" int32 (MoE layers),
                        "experts" int32 (E), "windows" list<int64> [q_max] and "hits" list<int32>
                        [q_max * layers * experts] (q-major, then layer, then expert): the session's
                        router window sums (mtp_observe/model/routing.py: windows of q = 1..q_max consecutive
                        scored tokens, and how many routed a token to each expert), on the session's last
                        request row, null on its other rows. The report's roofline reads it for the
                        distinct experts a batch touches (cost.ExpertCounts).

`replay --resume` continues a run only when model (config, head tensors, weights fingerprint,
generation config), tokenizer, k, dtype, device, sampling, inputs (path and sha256), options
and the tool version all equal the interrupted run's.

What this tool writes, and so all `--overwrite` removes (`prepare_run_directory`, entries.overwrite_plan): run.json (an
mtp-observe manifest), its temporaries `.run.json.tmp-<pid>`, the parts' temporaries
`.requests.parquet.part-<8 digits>.parquet.tmp-<pid>` / `.positions.parquet.part-....tmp-<pid>`,
requests.parquet/ and positions.parquet/ holding only `part-<8 digits>[-r<rank>].parquet` (and,
from runs written before grouping, their temporaries `.part-....parquet.tmp-<pid>`), and the lock file. Anything else — a hidden file, a foreign file
in a table directory, another tool's run.json, any symbolic link — is refused, naming it, before
anything is deleted; deleting unlinks those names and removes the two emptied directories, never
following a link.

The lock (`RunLock`): `fcntl.flock` on `.mtp-observe.lock`, taken by replay (rank 0 under torchrun)
before the directory is checked and held until the manifest is final; a second replay, --resume or
--overwrite on the directory is refused naming the holder (pid, host, start, written in the file).
The kernel releases the lock when its process dies, so a lock file left by a killed replay (its pid
dead) does not block: the file's content only names the holder, the flock is what locks.

Version 6 (no column added; docs/grammar.md): in a run with run.json `grammar` (replay --grammar tools), a row whose
predicted token x_{p+k} lies in a tool-call region the grammar constrains has p_accept_<profile> from the target's
logits with the grammar's disallowed tokens at -inf before the profile's sampler (renormalised over the allowed set,
as vLLM masks the target's logits before its rejection sampler), and 0 where draft_allowed is false. A version-5
grammar run's p_accept is unmasked; --resume refuses to mix the two (a different schema_version).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..drafting.columns import NOT_A_TREE
from ..errors import RunDirectoryError
from .entries import LOCK, MANIFEST, POSITIONS, REQUESTS, is_manifest, overwrite_plan
from .readers import _one_line, _run_error
from .schema import REQUESTS_SCHEMA, ROUTING, fit_type, positions_schema, requests_schema

SCHEMA_VERSION = 6  # 4: run.json errors[] may carry "turn" (one turn skipped under --on-error skip); 5: positions
#                     `accepted_past_end` (drafts past the end of the turn an engine counts as accepted), and
#                     replay --grammar's columns (forced, allowed, draft_allowed) and run.json `grammar`; 6: under
#                     --grammar, p_accept_<profile> is the masked sampler's on tool-call rows (module docstring)
SEGMENTS = ["reasoning", "text", "tool_call", "end"]


def part_name(session_index: int, rank: int | None = None) -> str:
    return f"part-{session_index:08d}" + (f"-r{rank}" if rank is not None else "") + ".parquet"


RESUME_HINT = "free space on that disk (or make it writable), then continue with the same command and --resume"


def cannot_write(path: Path, e: OSError, hint: str = RESUME_HINT) -> RunDirectoryError:
    """An OS failure writing `path` (a full disk, a file-size limit, a read-only directory) as one line."""
    reason = os.strerror(e.errno) if isinstance(e.errno, int) and e.errno > 0 else _one_line(e)
    return RunDirectoryError(f"{path}: cannot write ({reason}); {hint}")


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def write_part(table: pa.Table, directory: Path, name: str, temporary: Path | None = None) -> Path:
    """Write one part atomically: a temporary file (`temporary`, else dot-prefixed beside the part), fsync, then
    rename. A failed write (e.g. a full disk) leaves no temporary behind and raises one line (the session is
    recomputed on --resume). parts.write_group puts the temporary outside the table directory."""
    final = directory / name
    tmp = temporary if temporary is not None else directory / f".{name}.tmp-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # page checksums (CRC32 of every page, Parquet's PageHeader.crc): parts.read_part verifies them, so a page
        # damaged on disk or in a copy is caught in whichever column it is; every reader ignores or checks them
        pq.write_table(table, tmp, compression="zstd", write_page_checksum=True)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except OSError as e:  # pyarrow's IO errors are OSErrors too
        _unlink_quietly(tmp)
        raise cannot_write(final, e) from None
    return final


def write_json_atomic(path: Path, data: dict, hint: str = RESUME_HINT) -> None:
    """Write JSON atomically (temporary, rename): a failure leaves the previous file as it was. Always valid JSON
    (allow_nan=False): a NaN or an infinity that reached it is refused naming its key."""
    from ..outputs import non_finite_key

    try:
        text = json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n"
    except ValueError:
        key = non_finite_key(data)
        raise RunDirectoryError(f"{path}: {key} is {_at(data, key)}, which JSON cannot hold; give a finite number where it "
                                "comes from (an option, or the checkpoint's config.json)") from None
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        _unlink_quietly(tmp)
        raise cannot_write(path, e, hint) from None


# ---------------------------------------------------------------------------------------------
# Building one session's parts


def _at(data, key: str | None):
    """The value at a non_finite_key path (for the message)."""
    if key is None:
        return "not a JSON value"
    value = data
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", key):
        value = value[int(part[1:-1])] if part.startswith("[") else value[part]
    return value


def requests_table(session_id: str, requests, fits: list[dict] | None = None, profiles: list[str] | None = None,
                   recorded: dict | None = None, speculative: list[dict] | None = None,
                   routing: dict | None = None, session_index: int | None = None) -> pa.Table:
    """requests: objects with index, input_ids, spans (start, end, turn). Without fits: the version-1 columns.

    fits: per request {"tokens": [N], "<stat>_<profile>": [N]} over its N spans; recorded: the
    recorded_sampling struct of the session (source and parameters); speculative: per request
    {"k", "anchors", "accepted"} (sessions.speculative_steps), or None; routing: the session's router window
    sums (routing.RouterRecorder.take), written on its last request's row (a MoE target only); session_index: the
    session's index in the input stream (version 3), on every row.
    """
    data = {
        "session_id": [session_id] * len(requests),
        "request": [r.index for r in requests],
        "input_ids": [list(r.input_ids) for r in requests],
        "n_tokens": [len(r.input_ids) for r in requests],
        "spans": [[{"start": s.start, "end": s.end, "turn": s.turn} for s in r.spans] for r in requests],
    }
    if fits is None:
        return pa.table(data, schema=REQUESTS_SCHEMA)
    schema = requests_schema(profiles)
    names = [f.name for f in fit_type(profiles)]
    data["fit"] = [[{name: _plain(fit[name][i]) for name in names} for i in range(len(r.spans))] for r, fit in zip(requests, fits)]
    data["recorded_sampling"] = [recorded] * len(requests)  # None in a model-free run (no target, no sampler)
    data["speculative"] = list(speculative) if speculative is not None else [None] * len(requests)
    data["session_index"] = [session_index] * len(requests)
    if routing is not None:
        schema = schema.append(pa.field("routing", ROUTING))
        data["routing"] = [None] * (len(requests) - 1) + [routing] if requests else []
    return pa.table(data, schema=schema)


def _plain(x):
    """A numpy scalar as the Python number pyarrow takes."""
    return x.item() if hasattr(x, "item") else x


def positions_table(session_id: str, per_request: list[tuple[int, dict]], profiles: list[str],
                    drafters: list[str] | None = None, target: bool = True, precisions: list[str] | None = None,
                    confidence: bool = False, grammar: bool = False) -> pa.Table:
    """per_request: [(request index, columns from acceptance.request_rows)] -> one table, schema-exact.

    drafters: the run's drafter names (the columns then carry `drafter`, an index into them, and `draft_k`);
    rows are then ordered by (drafter, draft_k, request, pos, depth). target False: no target columns.
    precisions: the run's what-if precisions (the columns carry `head_precision`, an index into them, -1 for the
    served head: null); the served rows come first, then each precision's, each ordered as above. confidence:
    the columns carry `draft_confidence`."""
    import numpy as np

    trees = bool(per_request) and "tree_node" in per_request[0][1]
    past_end = bool(per_request) and "accepted_past_end" in per_request[0][1]
    schema = positions_schema(profiles, drafters=drafters is not None, target=target, trees=trees,
                              precisions=bool(precisions), confidence=confidence, grammar=grammar,
                              past_end=past_end)
    if not per_request:
        return schema.empty_table()
    cols = {name: np.concatenate([c[name] for _, c in per_request]) for name in per_request[0][1]}
    n = len(cols["pos"])
    request = np.concatenate([np.full(len(c["pos"]), r, dtype=np.int32) for r, c in per_request])
    if drafters is not None or precisions:
        keys = (cols["depth"], cols["pos"], request) + ((cols["draft_k"], cols["drafter"]) if drafters is not None else ())
        order = np.lexsort(keys + ((cols["head_precision"],) if precisions else ()))
        cols = {name: values[order] for name, values in cols.items()}
        request = request[order]
    segment = pa.DictionaryArray.from_arrays(pa.array(cols["segment"], pa.int8()), pa.array(SEGMENTS, pa.string()))
    arrays = {
        "session_id": pa.array([session_id] * n, pa.string()),
        "request": pa.array(request, pa.int32()),
        "segment": segment,
    }
    if drafters is not None:
        arrays["drafter"] = pa.DictionaryArray.from_arrays(pa.array(cols["drafter"], pa.int8()),
                                                           pa.array(list(drafters), pa.string()))
    if trees:
        arrays["tree_node"] = pa.array(cols["tree_node"], pa.int8(), mask=cols["tree_node"] == NOT_A_TREE)
    if precisions:
        codes = cols["head_precision"]
        arrays["head_precision"] = pa.DictionaryArray.from_arrays(pa.array(codes, pa.int8(), mask=codes < 0),
                                                                  pa.array(list(precisions), pa.string()))
    for field in schema:
        if field.name not in arrays:
            arrays[field.name] = pa.array(cols[field.name], field.type)
    return pa.table([arrays[f.name] for f in schema], schema=schema)


# ---------------------------------------------------------------------------------------------
# run.json read back (its names and what --overwrite removes: entries.py)


class _NotJsonConstant(ValueError):
    pass


def _no_constant(name: str):
    """json's parse_constant: NaN, Infinity and -Infinity are not JSON; a run.json holding one is refused."""
    raise _NotJsonConstant(name)


def read_manifest(path: Path) -> dict:
    """run.json, checked far enough to trust schema_version, k and sampling."""
    path = Path(path)
    if not path.is_dir():
        raise _run_error(path, "no such run directory; pass a directory written by `mtp-observe replay` "
                               "(it holds run.json)")
    manifest_path = path / "run.json"
    if not manifest_path.is_file():
        raise _run_error(manifest_path, "missing; this is not a run directory written by `mtp-observe replay`")
    try:
        manifest = json.loads(manifest_path.read_text(), parse_constant=_no_constant)
    except _NotJsonConstant as e:
        raise _run_error(manifest_path, f"holds {e}, which is not JSON (a NaN or infinite option value, before "
                                        "mtp-observe refused them, was written there); replay with finite option values") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _run_error(manifest_path, f"cannot be read as JSON ({_one_line(e)}); the run directory is damaged") from None
    if not isinstance(manifest, dict):
        raise _run_error(manifest_path, "is not a JSON object; the run directory is damaged")
    version = manifest.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _run_error(manifest_path,
                         f"schema_version {version!r} is not a version this tool wrote; not an mtp-observe run")
    if version > SCHEMA_VERSION:
        raise _run_error(
            manifest_path,
            f"schema_version {version} is newer than this mtp-observe {_tool_version()} reads ({SCHEMA_VERSION}); "
            "upgrade mtp-observe to read it",
        )
    if not is_manifest(manifest):
        name = (manifest.get("tool") or {}).get("name") if isinstance(manifest.get("tool"), dict) else None
        raise _run_error(manifest_path, f"tool.name is {name!r}, not 'mtp-observe'; not a run this tool wrote")
    k = manifest.get("k")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise _run_error(manifest_path,
                         f"k is {k!r}, expected the replayed Kmax (an integer >= 1); the run directory is damaged")
    sampling = manifest.get("sampling", {})
    if not isinstance(sampling, dict) or not all(isinstance(p, str) and p for p in sampling):
        raise _run_error(manifest_path, "sampling is not an object of profile names; the run directory is damaged")
    return manifest


def _tool_version() -> str:
    from .. import __version__

    return __version__


# ---------------------------------------------------------------------------------------------
# The lock: one replay at a time in a run directory


class RunLock:
    """fcntl.flock on run_dir/.mtp-observe.lock (module doc). acquire() creates run_dir if needed;
    release() unlinks the lock file and removes run_dir again if acquire created it and nothing was written."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK
        self.fd: int | None = None
        self.created_dir = False

    def acquire(self) -> "RunLock":
        import fcntl

        d = self.run_dir
        if d.is_file():
            raise RunDirectoryError(f"{d}: is a file; pick another --out")
        if not d.is_dir():
            try:
                d.mkdir(parents=True)
                self.created_dir = True
            except FileExistsError:
                pass
            except OSError as e:
                raise cannot_write(d, e, "choose another --out") from None
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except OSError as e:
                self._undo_dir()
                if os.path.islink(self.path):
                    raise RunDirectoryError(f"{self.path}: is a symbolic link; refusing to lock through it — remove "
                                            "it or choose another --out") from None
                raise cannot_write(self.path, e, "make the directory writable or choose another --out") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _holder(fd)
                os.close(fd)
                raise RunDirectoryError(f"{d}: another mtp-observe replay is writing this run ({holder}); wait for it "
                                        "to finish, or choose another --out") from None
            # Its holder may have removed the file between our open and our flock: lock the file that is there.
            st = os.fstat(fd)
            try:
                now = os.stat(self.path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev):
                break
            os.close(fd)
        import datetime
        import socket

        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}).encode() + b"\n")
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        _unlink_quietly(self.path)  # while still held: nobody can have locked this file meanwhile
        os.close(self.fd)
        self.fd = None
        self._undo_dir()

    def _undo_dir(self) -> None:
        if self.created_dir:
            try:
                self.run_dir.rmdir()  # only if empty: a refused run leaves nothing behind
            except OSError:
                pass


def _holder(fd: int) -> str:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {int(data['pid'])} on {data.get('host', '?')}, since {data.get('started', '?')}"
    except (OSError, ValueError, KeyError, TypeError):
        return "pid unknown"


# ---------------------------------------------------------------------------------------------
# Checking what is at --out


def prepare_run_directory(run_dir: Path, resume: bool, overwrite: bool, fix: str | None = None) -> dict | None:
    """Check what is at run_dir before a replay (with the RunLock held, or on a directory no replay uses).
    Returns the manifest to resume (a complete run's too: the caller checks its identity, then has nothing to
    do), or None for a fresh run.

    An existing directory needs --resume (continue an unfinished run) or --overwrite (start again);
    --overwrite removes only what a run writes (module doc), after checking every entry. fix: what an existing
    directory's refusal advises, for a command with other options than replay's (merge has no --resume)."""
    run_dir = Path(run_dir)
    if resume and overwrite:
        raise RunDirectoryError("--resume and --overwrite contradict each other; pass one")
    if run_dir.is_file():
        raise RunDirectoryError(f"{run_dir}: is a file; pick another --out")
    entries = sorted(e.name for e in os.scandir(run_dir) if e.name != LOCK) if run_dir.is_dir() else []
    if not entries:
        if resume:
            raise RunDirectoryError(f"{run_dir}: nothing to resume (no run there); drop --resume")
        return None
    if MANIFEST not in entries and (REQUESTS in entries or POSITIONS in entries):
        raise RunDirectoryError(f"{run_dir}: holds parts of a run but no run.json (deleted?), so it can be neither "
                                "resumed nor overwritten; move the directory away yourself, or choose another --out")
    if resume:
        return read_manifest(run_dir)  # a complete one too: the replay checks it is this run and has nothing to do
    if overwrite:
        files, directories = overwrite_plan(run_dir)
        for f in files:
            os.unlink(f)
        for d in directories:
            os.rmdir(d)
        return None
    raise RunDirectoryError(f"{run_dir}: already exists; "
                            + (fix or "pass --resume to continue it, --overwrite to replace it, or another --out"))


class RunComplete(RunDirectoryError):
    """`replay --resume` of a run that is already complete (and is this run): nothing to do. pipeline.replay
    returns the run as it is (exit 0, said); anywhere else it reads as the refusal it was before."""


# ---------------------------------------------------------------------------------------------
# Finished sessions of a run being resumed


def done_parts(run_dir: Path) -> set[str]:
    """Part names present in both tables (a session is done only when both of its parts are)."""
    names = []
    for table in (REQUESTS, POSITIONS):
        d = Path(run_dir) / table
        names.append({p.name for p in d.glob("part-*.parquet")} if d.is_dir() else set())
    return names[0] & names[1]


def remove_part(run_dir: Path, name: str) -> None:
    """Both tables' part `name` (to recompute its sessions)."""
    for table in (REQUESTS, POSITIONS):
        _unlink_quietly(Path(run_dir) / table / name)


def part_requests(run_dir: Path, name: str, session_id: str | None = None) -> list[tuple]:
    """[(input_ids [n] int32, spans [S, 2] int64)] of a finished session's requests, in order (what a
    resumed run feeds suffix decoding's global tree for the sessions it keeps). session_id: that session's
    only, in a part that groups several (parts.py); None: the part's whole (one session per part)."""
    import numpy as np

    filters = [("session_id", "=", session_id)] if session_id is not None else None
    table = pq.read_table(Path(run_dir) / REQUESTS / name, columns=["request", "input_ids", "spans"], filters=filters)
    out = []
    for r in np.argsort(table.column("request").to_numpy(), kind="stable"):
        ids = np.asarray(table.column("input_ids")[int(r)].as_py(), dtype=np.int32)
        spans = np.array([(sp["start"], sp["end"]) for sp in table.column("spans")[int(r)].as_py()], dtype=np.int64)
        out.append((ids, spans.reshape(-1, 2)))
    return out

