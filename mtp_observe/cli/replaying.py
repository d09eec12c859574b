"""The `replay` command: sessions through the target and the head into a run directory, and its closing summary."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from rich.table import Table

from ..errors import OptionError, UserError
from ..literal import literal
from ..wording import plural
from .common import (
    DEVICE_METAVAR,
    ChatTemplateOption,
    Dtype,
    OnError,
    ShardBy,
    TemplateKwargsOption,
    _check_on_error,
    _model_dir,
    _template_overrides,
    err,
    out,
    say,
    shard_options,
)

# Fixed sets of values (cli/common.py's convention): drafters.ngram.RUNNERS, serving.SERVE_DEVICES, FP8_ACTIVATIONS
NgramRunner = Literal["v2", "v1"]
ServeDevice = Literal["h100", "h200", "b200", "a100", "l40s", "mi300x", "cpu"]
Fp8Activations = Literal["dynamic", "none"]


def _parse_sampling(specs: list[str], recorded_with: Optional[str] = None):
    """--sampling specs and --recorded-with -> (profiles, the declared profile's name or None).

    The profiles are the built-in ones and the checkpoint's generation_config (added by the replay),
    replaced or extended by --sampling; --recorded-with NAME=... adds (or replaces) one more."""
    from ..model.target import profile_from_spec

    profiles = {}
    declared = None
    for option, spec in [("--sampling", s) for s in specs] + ([("--recorded-with", recorded_with)] if recorded_with else []):
        if option == "--recorded-with" and "=" not in spec:
            declared = spec
            continue
        try:
            profile = profile_from_spec(spec)
        except ValueError as e:
            raise OptionError(f"{option} {spec}: {e} (e.g. creative=1.0,0.95,50 or chat=0.7,0.8,20,1.5; top_k 0 = off)")
        profiles[profile.name] = profile  # a built-in name is replaced
        declared = profile.name if option == "--recorded-with" else declared
    return tuple(profiles.values()), declared


def _parse_ngram(text: Optional[str], runner: str = "v2"):
    """--ngram MIN,MAX (or N for both) and --ngram-runner -> drafters.ngram.NgramConfig, vLLM's resolution of
    the two bounds."""
    from ..drafting.drafters.ngram import ngram_config

    if text is None:
        return ngram_config(runner=runner)
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (1, 2) or not all(p.isdigit() for p in parts):
        raise OptionError(f"--ngram {text}: expected MIN,MAX (vLLM's prompt_lookup_min, prompt_lookup_max), e.g. 3,5")
    lo, hi = int(parts[0]), int(parts[-1])
    return ngram_config(lo, hi, runner=runner)


def _parse_trees(specs: list[str]) -> tuple:
    """--tree S,TOPK,T (repeatable) -> tree.TreeConfig's in the order given; a configuration named twice is refused."""
    from ..drafting.tree import MAX_TREES, parse_tree

    trees = tuple(parse_tree(spec) for spec in specs)
    names = [t.name for t in trees]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise OptionError(f"--tree {twice.removeprefix('tree:')}: named twice; give each configuration once")
    if len(trees) > MAX_TREES:
        raise OptionError(f"--tree: {len(trees)} configurations; at most {MAX_TREES} in one replay")
    return trees


def _parse_precisions(values: Optional[list[str]]) -> tuple:
    """--head-precision (repeatable, comma-separated) -> precision names, once each, in the order given."""
    from ..model.precisions import parse_precisions

    return parse_precisions(",".join(values)) if values else ()


def _parse_thresholds(values: Optional[list[str]]) -> tuple:
    """--draft-p-min (repeatable, comma-separated) -> thresholds as floats, in the order given."""
    out = []
    for text in ",".join(values or []).split(","):
        if not text.strip():
            continue
        try:
            out.append(float(text))
        except ValueError:
            raise OptionError(f"--draft-p-min {text.strip()}: expected a probability 0 to 1 (e.g. 0.3,0.5,0.8)") from None
    if values and not out:
        raise OptionError("--draft-p-min: no threshold given; e.g. --draft-p-min 0.3,0.5,0.8")
    return tuple(out)


def _with_defaults(extra, model_dir: Path) -> tuple:
    """The default profiles, each replaced by an --sampling profile of the same name, then the new ones."""
    from ..run.options import default_profiles

    by_name = {p.name: p for p in default_profiles(model_dir)}
    by_name.update({p.name: p for p in extra})
    return tuple(by_name.values())


def replay(
    files: Annotated[list[Path], typer.Argument(metavar="FILES", help="Session JSONL files (.gz too), directories of them, or - for standard input.")],
    model: Annotated[Optional[Path], typer.Option("--model", help="Checkpoint directory, or a Hugging Face id (ORG/NAME[@REVISION]) in the local cache (default: the bundled model).")] = None,
    k: Annotated[int, typer.Option("--k", help="Draft depth Kmax; one replay answers every K <= Kmax.")] = 4,
    out_dir: Annotated[Optional[Path], typer.Option("--out", "-o", help="Run directory (default: reports/run-<time>).")] = None,
    chunk_size: Annotated[int, typer.Option("--chunk-size", help="Prefill chunk (tokens) for the target and the head's row pass.")] = 2048,
    sampling: Annotated[Optional[list[str]], typer.Option("--sampling", help="Extra sampling profile NAME=T,TOP_P,TOP_K[,PRESENCE[,FREQUENCY[,REPETITION[,MIN_P]]]] (repeatable; the Qwen3.5 card's four, greedy and generation_config are built in).")] = None,
    recorded_with: Annotated[Optional[str], typer.Option("--recorded-with", help="The sampler the sessions were recorded with: greedy, a profile NAME, or NAME=T,TOP_P,TOP_K[,...] (default: the report names the best fit).")] = None,
    device: Annotated[str, typer.Option("--device", metavar=DEVICE_METAVAR, help="Where the target runs (auto: cuda if available).")] = "auto",
    dtype: Annotated[Dtype, typer.Option("--dtype", help="auto: bfloat16 on CUDA, float32 on CPU.")] = "auto",
    resume: Annotated[bool, typer.Option("--resume", help="Continue an unfinished run in --out without recomputing finished sessions.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the run in --out.")] = False,
    on_error: Annotated[OnError, typer.Option("--on-error", help="fail: a bad session stops the run; skip: it is recorded in run.json and skipped.")] = "fail",
    max_sessions: Annotated[Optional[int], typer.Option("--max-sessions", help="Replay at most N sessions (counted in input order).")] = None,
    device_map: Annotated[Optional[str], typer.Option("--device-map", help="auto: spread a target too large for one GPU over all visible GPUs (needs accelerate).")] = None,
    head_reading: Annotated[str, typer.Option("--head-reading", metavar="ENGINE", help="Whose reading of the head to replay where the engines differ (DeepSeek-V3 / GLM-4.5 NextN heads: the embedding at position 0, the state fed back; docs/nextn.md): vllm (0.33, the serve line's) or sglang (0.5.23). Qwen heads read alike.")] = "vllm",
    chat_template: ChatTemplateOption = None,
    template_kwargs: TemplateKwargsOption = None,
    drafters: Annotated[str, typer.Option("--drafters", help="Drafters to run side by side at every anchor: mtp (the head), ngram (vLLM's prompt lookup), suffix (suffix decoding), hybrid (Arctic's: suffix when its score >= K, else mtp), hybrid_longer (the longer of suffix's and mtp's), grammar and grammar+mtp (what the tool-call grammar forces, then mtp's draft; need --grammar tools). Model-free only (ngram, suffix): no weights are loaded.")] = "mtp",
    ngram: Annotated[Optional[str], typer.Option("--ngram", help="MIN,MAX: vLLM's prompt_lookup_min, prompt_lookup_max (default 5,5; one number sets both).")] = None,
    ngram_runner: Annotated[NgramRunner, typer.Option("--ngram-runner", help="Which vLLM model runner's n-gram rule: v2 (vLLM 0.33's default: the GPU speculator, always K tokens, the most recent match) or v1 (the CPU proposer: the earliest match, short or no drafts).")] = "v2",
    suffix_max_tree_depth: Annotated[int, typer.Option("--suffix-max-tree-depth", help="vLLM's suffix_decoding_max_tree_depth.")] = 24,
    suffix_max_cached_requests: Annotated[int, typer.Option("--suffix-max-cached-requests", help="vLLM's suffix_decoding_max_cached_requests (outputs the global tree keeps; 0: none).")] = 10000,
    suffix_max_spec_factor: Annotated[float, typer.Option("--suffix-max-spec-factor", help="vLLM's suffix_decoding_max_spec_factor (draft at most factor x match length + offset).")] = 1.0,
    suffix_max_spec_offset: Annotated[float, typer.Option("--suffix-max-spec-offset", help="Arctic's max_spec_offset (vLLM leaves it 0).")] = 0.0,
    suffix_min_token_prob: Annotated[float, typer.Option("--suffix-min-token-prob", help="vLLM's suffix_decoding_min_token_prob.")] = 0.1,
    serve_device: Annotated[ServeDevice, typer.Option("--serve-device", help="The GPU whose vLLM numerics the run describes (its block-FP8 kernels and top-k tie rule; the report's --device-spec names; cpu: vLLM without Triton).")] = "h100",
    fp8_activations: Annotated[Optional[Fp8Activations], typer.Option("--fp8-activations", help="Block-FP8 checkpoints: dynamic (W8A8: activations quantised per token per group, as vLLM's FP8 kernels do) or none (weight-only); default: what vLLM runs on --serve-device (dynamic on h100, h200, b200; none on a100, l40s).")] = None,
    tree: Annotated[Optional[list[str]], typer.Option("--tree", metavar="S,TOPK,T", help="Also grow and verify SGLang tree drafts at every anchor: S = --speculative-num-steps, TOPK = --speculative-eagle-topk, T = --speculative-num-draft-tokens (repeatable; S,TOPK,T,ancestors: the true-ancestor attention what-if). A what-if beside the chain: docs/trees.md.")] = None,
    part_sessions: Annotated[int, typer.Option("--part-sessions", metavar="N", help="Write the run's Parquet parts N sessions at a time at most (fewer when a part reaches 2M rows or a minute's work); 1: one part per session.")] = 256,
    progress_every: Annotated[float, typer.Option("--progress-every", metavar="SECONDS", help="Without a terminal (a CI log): print the progress line to stderr every SECONDS (0: never).")] = 30.0,
    shard: Annotated[Optional[str], typer.Option("--shard", metavar="I/N", help="Replay shard I of N (0-based; e.g. $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT): the sessions whose id hashes to I, whatever the file layout; join the shards with mtp-observe merge (docs/scale.md).")] = None,
    shard_by: Annotated[ShardBy, typer.Option("--shard-by", help="id: a session's shard is a hash of its id; tokens: shards balanced by tokens, longest session first (every session is rendered first).")] = "id",
    ray: Annotated[Optional[str], typer.Option("--ray", metavar="ADDRESS", help="Replay on a Ray cluster: local (start one here), auto (join the running one) or ray://HOST:PORT; needs pip install 'mtp-observe[ray]' (docs/scale.md).")] = None,
    replicas: Annotated[Optional[int], typer.Option("--replicas", metavar="N", help="With --ray: model replicas (Ray actors, each loads the model once; default: the cluster's GPUs / --gpus-per-replica, 1 without GPUs).")] = None,
    gpus_per_replica: Annotated[Optional[float], typer.Option("--gpus-per-replica", metavar="G", help="With --ray: GPUs per replica, on one node (the target spread over them with device_map when G > 1; default 1 when the cluster has GPUs, else 0).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the estimate of the work (tokens to prefill, anchors to draft, a time range from a short calibration on the model) and exit, writing nothing.")] = False,
    head_precision: Annotated[Optional[list[str]], typer.Option("--head-precision", metavar="P,...", help="What-if: re-run the head at these precisions on the same anchors, the target unchanged: bf16, fp8, int8, nvfp4, q8_0, q6_k, q4_k (comma-separated, repeatable; docs/whatifs.md).")] = None,
    grammar: Annotated[Optional[str], typer.Option("--grammar", metavar="tools", help="tools: run every recorded tool call through the grammar an engine decodes it under (the chat format's tool calls, arguments constrained by the tool's schema; xgrammar, pip install 'mtp-observe[grammar]'): forced tokens, drafts the grammar forbids (docs/grammar.md).")] = None,
    draft_p_min: Annotated[Optional[list[str]], typer.Option("--draft-p-min", metavar="P,...", help="What-if: stop drafting where the head's probability of its draft (llama.cpp's: softmax over its top 10 logits) falls below each threshold, 0 to 1 (comma-separated, repeatable; docs/whatifs.md).")] = None,
    target_engine: Annotated[Optional[str], typer.Option("--target-engine", metavar="URL", help="Run the target's layers in this running vLLM server (its hidden states read back; --model then needs only the config, tokenizer, head, embedding, final norm and lm_head: docs/engine-target.md).")] = None,
) -> None:
    """Replay sessions through the target with the MTP head (and other drafters) alongside; write the run directory."""
    from ..drafting.drafters.roster import NEEDS_MTP, parse_drafters
    from ..drafting.drafters.suffix import SuffixConfig
    from ..outputs import check_not_an_input
    from ..run.estimate import estimate_line
    from ..run.manifest import default_run_dir
    from ..run.options import ReplayOptions
    from ..run.pipeline import replay_estimate

    _check_on_error(on_error)
    _check_progress_every(progress_every)
    names = parse_drafters(drafters)
    grammar_mode = _grammar_mode(grammar, ray)
    shard_spec = shard_options(shard, shard_by)
    ray_options = _ray_options(ray, replicas, gpus_per_replica)
    ngram_config = _parse_ngram(ngram, ngram_runner)
    trees = _parse_trees(tree or [])
    suffix_config = SuffixConfig(max_tree_depth=suffix_max_tree_depth, max_cached_requests=suffix_max_cached_requests,
                                 max_spec_factor=suffix_max_spec_factor, max_spec_offset=suffix_max_spec_offset,
                                 min_token_prob=suffix_min_token_prob)
    model_free = not any(n in NEEDS_MTP for n in names)
    _check_reading(head_reading, model_free, bool(sampling or recorded_with), drafters)
    overrides = _template_overrides(chat_template, template_kwargs)
    bundled = model is None
    model_dir = _model_dir(model)
    out_path = out_dir or default_run_dir()
    check_not_an_input(out_path, "--out", files)  # the run would be written over what it reads
    extra, declared = _parse_sampling(sampling or [], recorded_with)
    opts = ReplayOptions(k=k, chunk_size=chunk_size, device=device, dtype=dtype,
                         profiles=_with_defaults(extra, model_dir) if not model_free else (), recorded_with=declared,
                         on_error=on_error, max_sessions=max_sessions, resume=resume, overwrite=overwrite,
                         device_map=device_map, template=overrides, drafters=names, ngram=ngram_config,
                         suffix=suffix_config, part_sessions=part_sessions, head_engine=head_reading, shard=shard_spec,
                         ray=ray_options, serve_device=serve_device, fp8_activations=fp8_activations,
                         trees=trees, head_precisions=_parse_precisions(head_precision),
                         draft_p_min=_parse_thresholds(draft_p_min), grammar=grammar_mode)
    if target_engine is not None:
        opts = _with_target_engine(opts, target_engine, model_free, dry_run)
    if dry_run:
        from ..run.estimate import breakdown_lines

        estimate = replay_estimate(files, model_dir, opts)
        for line in (estimate_line(estimate), *breakdown_lines(estimate)):
            say(out, line)
        return
    _replay_and_summarise(files, model_dir, out_path, opts, bundled, progress_every)


def _with_target_engine(opts, url: str, model_free: bool, dry_run: bool):
    """--target-engine URL: the engine probed (its version and model go in run.json); what it cannot go with refused."""
    import dataclasses

    from ..model.engine_target import probe_engine

    clash = ("--ray" if opts.ray is not None else "--device-map" if opts.device_map is not None else
             "--dry-run" if dry_run else "--drafters without mtp" if model_free else None)
    if clash is not None:
        raise OptionError(f"--target-engine runs the target in the engine: it does not go with {clash}; drop one")
    return dataclasses.replace(opts, target_engine=probe_engine(url))


def _grammar_mode(grammar: str | None, ray: str | None) -> str | None:
    """--grammar: checked, and xgrammar present (one line naming the extra otherwise); not with --ray."""
    from ..drafting.grammar import parse_grammar, require

    mode = parse_grammar(grammar)
    if mode is not None and ray is not None:
        raise OptionError("--grammar tools does not run on a Ray cluster yet (its replicas get no session's tools); "
                          "replay without --ray, or shard with --shard I/N")
    if mode is not None:
        require()
    return mode


def _check_progress_every(progress_every: float) -> None:
    if progress_every < 0:
        raise OptionError(f"--progress-every {progress_every:g}: expected seconds >= 0 (0: no progress lines)")


def _check_reading(head_reading: str, model_free: bool, scores_sampler: bool, drafters: str) -> None:
    """--head-reading is an engine's; --sampling / --recorded-with (scores_sampler) need a target."""
    from ..model.families import HEAD_ENGINES

    if head_reading not in HEAD_ENGINES:
        raise OptionError(f"--head-reading {head_reading}: expected one of {', '.join(HEAD_ENGINES)}")
    if model_free and scores_sampler:
        raise OptionError(f"--sampling and --recorded-with score the target's sampler, which a replay of model-free drafters "
                          f"only (--drafters {drafters}) does not run; add mtp to --drafters, or drop them")


def _replay_and_summarise(files, model_dir: Path, out_path: Path, opts, bundled: bool, progress_every: float) -> None:
    """The replay with its progress shown, then its summary (rank 0 only under torchrun); an interrupt keeps every
    finished session and says how to continue (exit 130)."""
    from ..run.pipeline import replay as run_replay
    from ..run.progress import ProgressDisplay

    rank0 = os.environ.get("RANK", "0") == "0"  # under torchrun only rank 0 draws and summarises
    try:
        # The estimate first; then a live line on a terminal, cleared when it stops (a failure leaves its error line
        # alone); a plain line every --progress-every seconds without one.
        with ProgressDisplay(err, live=rank0 and err.is_terminal, every_s=progress_every if rank0 else 0, say=say,
                             on_estimate=lambda line: say(out, line)) as progress:
            run_dir = run_replay(files, model_dir, out_path, opts, bundled=bundled, observer=progress if rank0 else None)
    except KeyboardInterrupt:  # run.json says "failed"; every finished session's part is complete on disk
        if rank0:
            done = _sessions_kept(out_path)
            say(err, f"interrupted: {plural(done, 'finished session')} {'is' if done == 1 else 'are'} kept in {out_path}; "
                     f"continue with the same command and --out {out_path} --resume")
        raise typer.Exit(130)
    if rank0:
        _print_replay_summary(run_dir)


def _ray_options(address: Optional[str], replicas: Optional[int], gpus: Optional[float]):
    """--ray, --replicas, --gpus-per-replica -> cluster.RayOptions (None without --ray). Checked here without
    importing Ray (the option checks run before anything is loaded)."""
    if address is None:
        for option, value in (("--replicas", replicas), ("--gpus-per-replica", gpus)):
            if value is not None:
                raise OptionError(f"{option} applies to a replay on Ray; add --ray local|auto|ray://HOST:PORT, or drop it")
        return None
    from ..run.cluster import Fault, RayOptions, check_address

    return RayOptions(address=check_address(address), replicas=replicas, gpus_per_replica=gpus, fault=Fault.from_environ())


def _sessions_kept(run_dir: Path) -> int:
    """The sessions an interrupted replay left on disk, as its run.json counts them (parts.counts_on_disk)."""
    from ..run.tables import read_manifest

    try:
        return int(read_manifest(run_dir).get("counts", {}).get("sessions_ok", 0))
    except (UserError, ValueError, TypeError):
        return 0


def _print_replay_summary(run_dir: Path) -> None:
    """One screen: what was replayed, α_k per depth, τ_sim(K) for each K, the recording sampler, where it went."""
    from ..report import drafter_cost, load_run, resolve_cost, run_drafters, summarize
    from ..run.tables import read_manifest

    manifest = read_manifest(run_dir)
    if (manifest.get("counts") or {}).get("sessions_ok") == 0:  # a shard that owns no session (the note said so)
        say(out, f"replay: no session in {run_dir}, a shard that owns none; next: mtp-observe merge, with every shard of "
                 "the job, then report the merged run")
        return
    if len(run_drafters(manifest)) > 1:
        _print_drafters_summary(run_dir)
        return
    run = load_run(run_dir)
    m, c = run.manifest, run.manifest["counts"]
    rep = summarize(run, drafter_cost(resolve_cost(run), run.drafter), replicates=200, seed=0)
    v = rep.overall.value
    t = Table(title=f"replay: {plural(c['sessions_ok'], 'session')} ({c['sessions_skipped']:,} skipped), "
                    f"{plural(c['requests'], 'request')}, {plural(c['tokens_replayed'], 'token')}, "
                    f"{plural(c['anchors'], 'anchor')} · {m['timing']['tokens_per_s']:,} tok/s")
    t.add_column("K / depth k", justify="right")
    t.add_column("α_k (conditional)", justify="right")
    t.add_column("A_k (per position)", justify="right")
    t.add_column("τ_sim(K)", justify="right")
    t.add_column("τ(K) vLLM", justify="right")
    for k in range(rep.k):
        t.add_row(str(k + 1), f"{v.alpha[k]:.3f}", f"{v.accept_rate[k]:.3f}", f"{v.tau_sim[k]:.3f}", f"{v.tau[k]:.3f}")
    out.print(t)
    rec = rep.recording
    fit = (f"recording sampler: {rec.label}" if rec.fits else
           f"recording sampler: none of the {len(rec.candidates)} candidates fits these sessions, so they are not this "
           "target's own traffic (mtp-observe report lists the statistics)" if rec.name is None else
           f"recording sampler: {rec.label} does not fit these sessions (mtp-observe report lists the statistics)")
    say(out, f"on-policy rate {float(v.on_policy):.3f}; {fit}")
    _say_what_ifs(run_dir, m)
    _kernel_note(m)
    say(out, f"run directory: {run_dir}   next: mtp-observe report {run_dir}")


def _kernel_note(manifest: dict) -> None:
    """transformers' kernel-fallback warnings, caught during the replay (kernels.py), said once in its summary."""
    from ..model.kernels import fallback_note

    note = fallback_note(str(manifest.get("device", "")))
    if note is not None:
        say(out, f"note: {note}")


def _say_what_ifs(run_dir: Path, manifest: dict) -> None:
    """One line per tree and layer rule of the run (docs/trees.md): τ_sim at its depth; `report` has the rest."""
    from ..report import load_run, model_free_cost, run_layer_rules, run_trees, summarize

    parts = []
    for t in run_trees(manifest):
        run = load_run(run_dir, variant=(t["name"], int(t["steps"])))
        v = summarize(run, model_free_cost(run), replicates=1, seed=0).overall.value  # τ_sim does not depend on the cost
        parts.append(f"{t['name']} τ_sim {float(v.tau_sim[int(t['steps']) - 1]):.3f}")
    for r in run_layer_rules(manifest):
        if r.get("k"):
            run = load_run(run_dir, variant=(r["drafter"], int(r["k"])))
            v = summarize(run, model_free_cost(run), replicates=1, seed=0).overall.value
            parts.append(f"{r['drafter']} (layer i at step i) τ_sim({r['k']}) {float(v.tau_sim[int(r['k']) - 1]):.3f}")
    if parts:
        say(out, "what-ifs (mtp-observe report has their speedup): " + "; ".join(parts))


def _print_drafters_summary(run_dir: Path) -> None:
    """The replay summary of a run of several drafters: τ_sim(K) of each (α_1 in its header), where it went. One
    drafter's rows are read at a time."""
    from ..report import load_run, model_free_cost, run_drafters, summarize
    from ..run.tables import read_manifest

    m = read_manifest(run_dir)
    c = m["counts"]
    rate = (m.get("timing") or {}).get("tokens_per_s")
    t = Table(title=f"replay: {c['sessions_ok']} sessions ({c['sessions_skipped']} skipped), {c['requests']} requests, "
                    f"{c['tokens_replayed']:,} tokens, {c['anchors']:,} anchors per drafter, {c['rows']:,} rows"
                    + (f" · {rate:,} tok/s" if rate else ""))
    t.add_column("K", justify="right")
    names, values = run_drafters(m), {}
    for name in names:  # τ_sim and α_1 do not depend on the cost
        run = load_run(run_dir, name)
        values[name] = summarize(run, model_free_cost(run), replicates=1, seed=0).overall.value
        del run
        t.add_column(literal(f"τ_sim(K) {name} (α_1 {float(values[name].alpha[0]):.3f})"), justify="right")
    for k in range(m["k"]):
        t.add_row(str(k + 1), *[f"{values[n].tau_sim[k]:.3f}" for n in names])
    out.print(t)
    if m.get("target_ran") is False:
        say(out, "model-free replay: no target ran (no p_accept, no on-policy rate, no recording-sampler check)")
    else:
        _kernel_note(m)
    _say_what_ifs(run_dir, m)
    say(out, f"run directory: {run_dir}   next: mtp-observe report {run_dir}")
