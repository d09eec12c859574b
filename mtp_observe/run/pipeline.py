"""The pipeline: the one place that ties the stages together.

Contract: `replay(inputs, model_dir, out, opts)` writes a run directory (tables.py) from session files (paths, or
one sessions.inputs.Inputs: the sessions are read once and every owned session rendered once, for the shard plan,
the manifest, the estimate and the replay alike); `replay_estimate(inputs, model_dir, opts)` is what `--dry-run`
prints. The model is loaded by model/loading.py, a request replayed by requests.py, the options resolved by
options.py.

Which samplers a replay scores (one p_accept_<profile> column and one set of fit sums each):
`default_profiles` (the Qwen3.5 card's four, greedy, the checkpoint's generation_config when it
has one), replaced or extended by `--sampling`, plus `recorded`: each session's own meta.sampling
(`session_sampler`; a key absent or null takes the server default, generation_config, else vLLM's),
and for a session without one the fallback (`recorded_fallback`: the `--recorded-with` sampler,
else generation_config, else vLLM's defaults). Profiles with equal parameters are computed once.

Drafters (`--drafters`, drafters/roster.py): the head always drafts when mtp or a hybrid is asked for; every
other drafter drafts at the same anchors from the same tokens, and the target scores all their drafts in one
reduction per request (`drafter_columns`). With model-free drafters only (ngram, suffix) no weights are read:
the model directory need hold only the tokenizer (and generation_config.json for the end-of-turn ids), the rows
have no target columns, and the run runs on the CPU (`model_free_request`). Suffix decoding's global tree is fed
every session of the input in input order on every rank (`_replay_sessions`), so rows do not depend on the
number of ranks or on resuming.

Past one process (docs/scale.md): `--shard I/N` replays the sessions shards.py assigns to shard I (by id, or by
tokens) and reads the others' recorded outputs into the global tree in input order, as a torchrun rank does;
`--ray` hands the sessions to replicas on a Ray cluster (cluster.py). Both write an ordinary run directory whose
requests carry each session's input index (`session_index`), the canonical order the report reads.
What-ifs (`--head-precision`, `--draft-p-min`; docs/whatifs.md): a copy of the head per precision
(precisions.head_at, built once) runs its own row pass and chain at the same anchors of every request; its rows
join the served head's in the one target reduction and are written after them with `head_precision` set
(whatif_heads.py). The thresholds need only every head draft's confidence
(`draft_confidence`); the report walks them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..drafting.acceptance import NonFiniteOutput
from ..drafting.whatif_heads import head_whatifs
from ..errors import OptionError
from ..model.checkpoint import read_checkpoint
from ..model.loading import LoadedModel, load_model, resolve_device, resolve_dtype
from ..model.target import RECORDED
from ..sessions.inputs import Inputs
from .manifest import COUNT_KEYS, MAX_KEYS, Tally, finish_manifest, identity, start_manifest
from .options import (
    Observer,
    ReplayOptions,
    check_head_options,
    check_model_free,
    check_options,
    default_profiles,
    drafter_roster,
    head_variants,
    recorded_fallback,
    session_sampler,
    written_draft_ks,
)
from .ranks import Ranks, portable, ranks_from_env
from .requests import session_parts
from .shards import plan_shard

# ---------------------------------------------------------------------------------------------
# Replay: sessions -> requests -> target + head -> rows -> run directory


def replay(files, model_dir: Path, out: Path, opts: ReplayOptions, bundled: bool = False, observer: Observer | None = None) -> Path:
    """Replay sessions into a run directory (PRODUCT.md's contract). Returns the run directory.

    files: paths (directories expanded, "-" for standard input) or a sessions.inputs.Inputs already built.
    Under torchrun every rank replays the sessions it owns (input index modulo world size) and
    writes their parts; rank 0 locks and prepares the directory, gathers counts and errors once
    every rank has finished, writes the manifest and lets go of the lock. Each rank groups its own
    sessions into parts named by their first session (parts.py), so the rows are the same whatever the
    number of ranks and --resume reads any grouping, though the part files differ. With opts.shard only the
    shard's sessions are replayed (shards.py); with opts.ray the replicas of a Ray cluster replay them and this
    process writes their parts (cluster.py).
    """
    observer = observer or Observer()
    roster = drafter_roster(opts)  # --drafters: which need the target's weights (mtp, the hybrids), which do not
    model_free = not roster.needs_model
    check_model_free(opts, roster)
    opts = ReplayOptions(**{**opts.__dict__, "profiles": tuple(opts.profiles) or
                            (default_profiles(model_dir) if not model_free else ())})
    check_options(opts)
    if not isinstance(files, Inputs) and any(str(f) == "-" for f in files) and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise OptionError("- (standard input) reaches only one of torchrun's processes; give the sessions as a file")
    if opts.ray is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise OptionError("--ray under torchrun: a Ray job is one process that drives the cluster's replicas; run it "
                          "without torchrun (or use torchrun without --ray)")
    fallback, fallback_name = recorded_fallback(opts, model_dir)
    # directories expanded, "-" (standard input) copied once, missing paths refused, every input holding a session,
    # before any work; the sessions themselves are read once, by the first step that needs them
    inputs = Inputs.of(files, opts.max_sessions)
    cluster = None
    if opts.ray is not None:  # join (or start) the Ray cluster: how many GPUs a replica has decides the device
        from .cluster import connect

        cluster = connect(opts.ray, opts.device, model_free)
    try:
        return _replay(inputs, model_dir, out, opts, bundled, observer, roster, model_free, fallback, fallback_name,
                       cluster)
    finally:
        if cluster is not None:
            cluster.close()


@dataclass(frozen=True)
class Setting:
    """What a replay decided before it writes anything (every rank the same)."""

    out: Path  # where the run is written (a symbolic link in --out followed)
    given: Path  # --out as given
    device: str
    dtype: object  # torch.dtype, None for a model-free replay
    info: object  # model.checkpoint.CheckpointInfo, None for a model-free replay
    serving: object  # model.serving.ServingNumerics
    variants: object  # drafting.head_variants.Variants
    renderer: object  # sessions.rendering.Renderer: one for the plan, the estimate and the replay
    plan: object  # shards.ShardPlan, None without --shard


def _setting(inputs: Inputs, model_dir: Path, out: Path, opts: ReplayOptions, model_free: bool,
             cluster) -> tuple[Setting, Ranks]:
    if cluster is not None:
        device = cluster.device
    else:
        device = resolve_device(opts.device) if not model_free else "cpu"  # model-free drafters run on the CPU
    ranks = ranks_from_env(device)
    given = Path(ranks.from_rank0(str(out)))  # a default --out carries rank 0's timestamp to every rank
    if ranks.world > 1 and device.startswith("cuda") and ":" not in device:
        device = f"cuda:{ranks.local_rank}"
    dtype = resolve_dtype(opts.dtype, device) if not model_free else None
    info = read_checkpoint(model_dir) if not model_free else None  # model-free: no weights, not even their headers
    serving, variants = check_head_options(opts, info)
    renderer = _renderer(info, model_dir, opts)
    plan = None
    if opts.shard is not None:  # the shard's sessions, from the whole input (rank 0 reads it, every rank gets it)
        plan = ranks.from_rank0(plan_shard(inputs, opts.shard, renderer) if ranks.rank == 0 else None)
    # A symbolic link in --out (or above it) is followed once, here, and said: the run is written where it points.
    resolved = given.resolve() if given.resolve() != Path(os.path.abspath(given)) else given
    return Setting(resolved, given, device, dtype, info, serving, variants, renderer, plan), ranks


def _renderer(info, model_dir: Path, opts: ReplayOptions):
    from ..sessions.rendering import Renderer

    renderer = Renderer.from_model_dir(info.path if info is not None else model_dir,
                                       vocab_size=info.geometry.vocab_size if info is not None else None,
                                       overrides=opts.template)
    renderer.turn_errors = opts.on_error  # skip: a turn that cannot be reconstructed is left out, not its session
    return renderer


def _replay(inputs: Inputs, model_dir: Path, out: Path, opts: ReplayOptions, bundled: bool, observer: Observer, roster,
            model_free: bool, fallback, fallback_name: str, cluster) -> Path:
    """replay's steps once the inputs are checked (and, under --ray, the cluster joined)."""
    from . import tables

    st, ranks = _setting(inputs, model_dir, out, opts, model_free, cluster)
    out = st.out

    # 1. Rank 0 locks the directory, checks it (fresh, --resume or --overwrite) against this run's identity.
    failure, manifest, lock = None, None, None
    if ranks.rank == 0:
        try:
            lock = tables.RunLock(out).acquire()
            run_identity = identity(st.info, inputs, opts, st.dtype, st.device, ranks, fallback, fallback_name, roster,
                                    model_dir, shard_plan=st.plan, serving=st.serving, variants=st.variants)
            manifest = start_manifest(out, opts, st.info, run_identity, bundled, ranks.world, model_dir,
                                      note=observer.note)
        except BaseException as e:  # nothing was written: let go of the directory (and of a directory we made)
            if lock is not None:
                lock.release()
            failure = e
    shared = ranks.from_rank0(portable(failure) if failure is not None and ranks.world > 1 else failure)
    if isinstance(shared, tables.RunComplete):  # --resume of a run that is complete: nothing to do (a nightly job)
        observer.note(str(shared))
        return out
    if failure is not None:
        raise failure  # rank 0: the error itself
    if shared is not None:
        raise shared
    if out != st.given:
        observer.note(f"--out {st.given} resolves to {out} (through a symbolic link); the run is written there")
    try:
        manifest = _replay_and_finish(inputs, model_dir, opts, observer, roster, model_free, fallback, cluster, ranks,
                                      st, manifest)
    finally:
        if lock is not None:
            lock.release()
    return _said_done(out, manifest, st.plan, ranks, observer)


def _replay_and_finish(inputs, model_dir, opts, observer, roster, model_free, fallback, cluster, ranks, st, manifest):
    """2. This rank's sessions (or, under --ray, the cluster's); 3. rank 0 merges every rank's counts and errors into
    the manifest. Raises the first failure of any rank, after every rank has reached the gather."""
    from ..errors import UserError

    try:
        if cluster is not None:
            result = cluster.replay(inputs, st.out, opts, model_dir, st.dtype, observer, fallback, roster, st.plan)
        else:
            model = _load(model_dir, opts, st) if not model_free else None
            result = _replay_sessions(inputs, st.out, opts, model, ranks, observer, fallback, roster, st.renderer,
                                      st.plan)
    except BaseException as e:  # every rank must reach the gather below, whatever happened here
        result = {"failure": e}
    results = ranks.gather({k: v if k != "failure" else portable(v) for k, v in result.items()})
    finished = None
    if ranks.rank == 0:
        try:
            finish_manifest(st.out, manifest, results, inputs.files)
        except UserError as e:
            finished = e
    if ranks.world > 1:
        import torch.distributed as dist

        dist.barrier()
    failures = [r["failure"] for r in results if r.get("failure") is not None]
    if "failure" in result:
        raise result["failure"]
    if failures:
        raise failures[0]
    if finished is not None:
        raise finished
    return manifest


def _load(model_dir: Path, opts: ReplayOptions, st) -> LoadedModel:
    """The target and the head; with --target-engine the target's layers are the engine's (engine_target)."""
    if opts.target_engine is not None:
        from ..model.engine_target import load_engine_model

        return load_engine_model(model_dir, opts.target_engine, st.dtype, device=st.device, head_engine=opts.head_engine)
    return load_model(model_dir, device=st.device, dtype=st.dtype, device_map=opts.device_map,
                      head_engine=opts.head_engine, serving=st.serving)


def _said_done(out: Path, manifest, plan, ranks, observer: Observer) -> Path:
    """The end of a replay: an empty shard is a success (merge joins it like any other shard); a run that replayed
    no session at all is refused."""
    from . import tables

    counts = manifest["counts"] if manifest is not None else {}
    empty = plan.none_owned() if plan is not None else None
    if empty is not None:
        if ranks.rank == 0:
            observer.note(f"{empty}: nothing to replay; {out} is a complete run of no session, which merge joins "
                          "like any other shard")
        return out
    if ranks.rank == 0 and counts.get("sessions_ok") == 0:
        from ..errors import InputError

        raise InputError(f"{out}: no session was replayed ({counts.get('sessions_skipped', 0)} skipped; the reasons "
                         f"are under errors in {out / tables.MANIFEST}); fix the inputs, or pass others")
    return out


def replay_estimate(files, model_dir: Path, opts: ReplayOptions):
    """What `replay --dry-run` prints (estimate.Estimate): the work of replaying the input (its first --max-sessions
    sessions, those a resumed run finished included; under --shard I/N only the shard's own), priced by a
    calibration on the model. Writes nothing."""
    roster = drafter_roster(opts)
    model_free = not roster.needs_model
    check_model_free(opts, roster)
    opts = ReplayOptions(**{**opts.__dict__, "profiles": tuple(opts.profiles) or
                            (default_profiles(model_dir) if not model_free else ())})
    check_options(opts)
    info = read_checkpoint(model_dir) if not model_free else None
    check_head_options(opts, info)  # what the run refuses at once
    fallback, _ = recorded_fallback(opts, model_dir) if not model_free else (None, None)
    inputs = Inputs.of(files, opts.max_sessions)
    model = None
    if not model_free:
        device = resolve_device(opts.device)
        model = load_model(model_dir, device=device, dtype=resolve_dtype(opts.dtype, device), device_map=opts.device_map,
                           head_engine=opts.head_engine)
    renderer = _renderer(model.info if model is not None else None, model_dir, opts)
    plan = plan_shard(inputs, opts.shard, renderer) if opts.shard is not None else None
    owns = (lambda index: True) if plan is None else set(plan.indices).__contains__
    return _estimate(inputs, opts, model, renderer, owns, fallback, roster)


def _estimate(inputs: Inputs, opts: ReplayOptions, model: LoadedModel | None, renderer, owns, fallback, roster,
              finished=None):
    """estimate.Estimate of the sessions _replay_owned will replay (the first --max-sessions, those `owns` takes,
    not finished before, rendering), priced by estimate.calibrate_replay on the model with the run's profiles and
    a fresh roster of its drafters (model None: the work alone). The renderings are kept for the replay."""
    from ..sessions.reading import SessionError, Skipped
    from .estimate import Estimate, ReplayWork, calibrate_replay, replay_work
    from .estimate_terms import extra_terms

    heads = model.info.geometry.num_heads if model is not None else 1
    work = ReplayWork()
    for item in inputs.items("skip"):
        if isinstance(item, Skipped) or not owns(item.index):
            continue
        if finished and item.id in finished:
            work += ReplayWork(done_tokens=finished[item.id].counts["tokens_replayed"])
            continue
        try:
            work += replay_work(inputs.rendered(item, renderer), opts.k, opts.chunk_size, heads)
        except SessionError:
            continue  # the replay skips it (or stops at it)
    if model is None:
        return Estimate(work, k=opts.k, why_no_time="no time estimate (model-free drafters: no target runs)")
    drafters = drafter_roster(opts) if tuple(roster.names) != ("mtp",) else None
    profiles = tuple(opts.profiles) + (fallback.renamed(RECORDED),)
    try:
        rates = calibrate_replay(model, opts.k, profiles, opts.chunk_size, drafters,
                                 extra_terms(opts, model, renderer))
    except NonFiniteOutput:  # the replay itself says so, naming the session and the fix
        return Estimate(work, k=opts.k, why_no_time="no time estimate (the model's outputs are not finite)")
    return Estimate(work, rates, k=opts.k)


def _replay_sessions(inputs: Inputs, out: Path, opts: ReplayOptions, model: LoadedModel | None, ranks: Ranks,
                     observer: Observer, fallback, roster, renderer, plan=None) -> dict:
    """Replay the sessions this rank owns into grouped parts (parts.PartWriter); whatever stops it (a failure,
    Ctrl-C), the sessions it finished are written first. Returns its counts and errors."""
    from . import parts

    writer = parts.PartWriter(out, max_sessions=opts.part_sessions)
    try:
        result = _replay_owned(inputs, out, opts, model, ranks, observer, fallback, roster, renderer, writer, plan)
    except BaseException:
        try:
            writer.flush()
        except Exception:  # e.g. the disk that failed the run is still full: its own error is what the user sees
            pass
        raise
    writer.flush()
    return result


def _finished_parts(out: Path, opts: ReplayOptions, roster, variants, ranks, observer):
    """A resumed run's finished sessions (parts.finished_sessions; rank 0 checks and repairs the parts once, before
    anyone writes)."""
    from . import parts

    finished = parts.finished_sessions(out, opts.k, written_draft_ks(opts, roster, variants),
                                       on_damaged=lambda path, why:
                                       observer.note(f"{path}: {why}; recomputing its sessions")) if ranks.rank == 0 else None
    return ranks.from_rank0(finished)


def _replay_owned(inputs: Inputs, out: Path, opts: ReplayOptions, model: LoadedModel | None, ranks: Ranks,
                  observer: Observer, fallback, roster, renderer, writer, plan=None) -> dict:
    """Replay the sessions this rank owns; finished sessions of a resumed run are kept. Returns its counts and errors.

    A session is this rank's when its shard is this run's (plan: shards.ShardPlan, None without --shard) and its
    input index is the rank's. model None: a model-free replay (the roster's drafters alone, no target). When a
    drafter keeps state across requests (suffix decoding's global tree), every session of the input reaches it in
    input order: the ones this rank replays through `draft`, the others — another rank's or shard's, or a resumed
    run's finished ones — through `add_outputs` (their recorded outputs rendered, or read back from the finished
    part; never replayed), so rows do not depend on the number of ranks or shards or on resuming. Without such a
    drafter another rank's or shard's sessions are never rendered."""
    import time

    from ..model.routing import RouterRecorder
    from ..model.target import VLLM_DEFAULTS, generation_config_profile
    from ..sessions.reading import input_name
    from .shards import session_key

    variants = head_variants(opts, model.info if model is not None else None)  # trees, the stepwise layer rule
    finished = _finished_parts(out, opts, roster, variants, ranks, observer)
    tally = Tally(dict.fromkeys(COUNT_KEYS + MAX_KEYS, 0), [], {input_name(f): 0 for f in inputs.files})
    mine = set(plan.indices) if plan is not None else None  # --shard: the input indices this shard owns

    def owns_index(index: int) -> bool:
        return ranks.owns(index) and (mine is None or index in mine)

    # The first line: the work ahead (this rank's share under torchrun), priced on this model; none for an observer
    # that drops it (the default: no calibration for it).
    if ranks.rank == 0 and type(observer).estimate is not Observer.estimate:
        observer.estimate(_estimate(inputs, opts, model, renderer, owns_index, fallback, roster, finished))
        if model is not None and getattr(model.target, "engine", None) is not None:
            model.target.engine.self_test_again()  # the calibration's synthetic requests were tested: now the sessions'
    observer.start(len([i for i in (plan.indices if plan is not None else range(inputs.count())) if ranks.owns(i)]))
    started = time.time()
    recorder = RouterRecorder(model.target, opts.k + 1) if model is not None else None  # q = 1..Kmax+1 tokens a sequence
    if recorder is not None and not recorder.active:
        recorder.close()
        recorder = None
    server_default = (generation_config_profile(model.info.path) or VLLM_DEFAULTS) if model is not None else None
    step = _SessionStep(inputs, out, opts, model, roster, renderer, fallback, server_default, observer, writer, recorder,
                        variants, head_whatifs(opts, model), finished, tally)
    for item in inputs.items(opts.on_error):
        tally.per_file[item.path] += 1
        if (plan is None or plan.owns(session_key(item))) and ranks.owns(item.index):
            step.own(item)
        else:
            step.feed_other(item)
    return {"counts": tally.counts, "errors": tally.errors, "per_file": tally.per_file,
            "fresh_tokens": tally.fresh_tokens, "wall_s": time.time() - started,
            "drafting": roster.timing() if tuple(roster.names) != ("mtp",) else {},
            **({"grammar": roster.grammar.manifest()} if roster.grammar is not None else {})}


@dataclass
class _SessionStep:
    """One session of the input, as _replay_owned meets it: replayed (its own), kept (a resumed run's finished
    one) or fed to a drafter with state across sessions (another rank's or shard's)."""

    inputs: Inputs
    out: Path
    opts: ReplayOptions
    model: object
    roster: object
    renderer: object
    fallback: object
    server_default: object  # the server's sampler for a meta.sampling key left out (generation_config, else vLLM's)
    observer: Observer
    writer: object
    recorder: object
    variants: object
    whatifs: object
    finished: dict
    tally: Tally

    def feed(self, requests) -> None:  # state only: the requests another rank or shard writes, or a resumed run kept
        for tokens, spans in requests:
            self.roster.add_outputs(tokens, spans)

    def feed_other(self, item) -> None:
        from ..sessions.reading import SessionError, Skipped

        if self.roster.stateful and not isinstance(item, Skipped):
            try:
                self.feed([(r.input_ids, r.spans) for r in self.inputs.rendered(item, self.renderer).requests])
            except SessionError:
                pass  # its owner skips it (or stops the run): it has no outputs either way
            self.inputs.release(item)

    def own(self, item) -> None:
        from ..sessions.reading import Skipped
        from . import tables

        if isinstance(item, Skipped):
            self.tally.skip(self.observer, item.index, item.path, item.line, item.session_id, item.message)
            return
        c = self.finished[item.id].counts if item.id in self.finished else None  # a resumed run's finished session
        if c is not None and self.roster.stateful:
            self.feed(tables.part_requests(self.out, self.finished[item.id].part, item.id))
        if c is None:
            c = self.replay(item)
            if c is None:
                return
        self.tally.add(c)
        self.observer.session(item.id, c["tokens_replayed"], skipped=False)

    def replay(self, item) -> dict | None:
        """The session replayed and added to the writer; its counts (None: skipped under --on-error skip)."""
        from ..sessions.reading import SessionError, speculative_steps
        from .estimate import request_works

        model, opts = self.model, self.opts
        try:
            rendered = self.inputs.rendered(item, self.renderer)
            recorded, source = (session_sampler(item, self.fallback, self.server_default) if model is not None
                                else (None, None))
            speculative = speculative_steps(item)  # generate --speculative's own loop, for the report to compare
        except SessionError as e:
            if opts.on_error == "fail":
                raise
            self.tally.skip(self.observer, item.index, e.path, e.line, e.session_id, str(e))
            return None
        self.tally.skip_turns(self.observer, item.index, item, rendered.skipped_turns)
        self.tally.say_switches(self.observer, item, self.renderer.switches(item))
        heads = model.info.geometry.num_heads if model is not None else 1
        self.observer.session_start(item.id, rendered.n_tokens, len(rendered.requests),
                                    work=request_works(rendered, opts.k, opts.chunk_size, heads))
        if self.roster.grammar is not None:  # --grammar: the session's tools, the target's tokenizer
            r = self.renderer
            self.roster.grammar.begin_session(rendered.session, r.tokenizer, r.vocab_size or len(r.tokenizer), r.eos_ids)
        positions, requests, c = session_parts(model, item.id, item.index, rendered.requests, opts, self.roster,
                                               recorded, source, speculative, self.recorder, self.observer,
                                               f"{item.path}:{item.line}", self.variants, self.whatifs)
        self.writer.add(item.index, positions, requests)  # written with the sessions before and after it (parts.py)
        self.inputs.release(item)
        self.tally.fresh_tokens += rendered.n_tokens
        return c
