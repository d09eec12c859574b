"""The cluster: a replay on Ray — replicas that load the model once, sessions as tasks, each finished session written once.

Contract:
    RayOptions(address, replicas, gpus_per_replica)   what `replay --ray ADDRESS --replicas N --gpus-per-replica G`
                                                      asks for (ADDRESS: local, auto or ray://HOST:PORT)
    connect(options, device, model_free) -> Cluster   joins Ray (or starts a local cluster) and decides each replica's
                                                      GPUs and device; a refusal is one line (OptionError): more
                                                      replicas than the cluster's CPUs (one each) or GPUs hold
                                                      (they would wait for resources forever), ray:// without the
                                                      Ray client (grpcio: the [ray] extra's ray[client])
    Cluster.replay(files, out, opts, model_dir, dtype, observer, fallback, roster, plan) -> dict
                                                      the pipeline's step 2 (pipeline._replay): every session of the
                                                      input (of the shard, with --shard) replayed by the replicas, its
                                                      parts written here; returns the counts and errors a process of
                                                      a replay returns, and run.json `cluster`
    Cluster.close()                                   lets go of Ray (a `--ray local` cluster is shut down)

Ray is an optional extra (`pip install 'mtp-observe[ray]'`); nothing else in the package imports this module or ray.

What it follows, and why:
  - ray.data.llm (`build_llm_processor` with a `vLLMEngineProcessorConfig`: `concurrency` engine replicas, each an
    actor of a map_batches actor pool that loads the model once; `batch_size` is "the unit of fault tolerance",
    smaller being more fault-tolerant): here a replica is an actor (`Replica`) that loads the target and the head
    once — across its G GPUs with device_map when G > 1 — and the unit of work and of failure is one session.
  - Ray Data's checkpointing by id column (`ray.data.checkpoint.CheckpointConfig(id_column=...)`: "ID values must be
    unique across all rows in the dataset and must persist during all operators"; rows whose id is checkpointed are
    filtered out of the input on restart): the id is the session id (unique within a run, sessions.py), and the
    checkpoint is the run directory itself — a session is finished once its part is on disk (parts.py), so a
    preempted or failed job continues with the same command and --resume, replaying only the sessions not written.
    A session is written once: only this driver writes, each session in at most one part, checked at the end
    (merge.sessions_of, the check `merge` makes).
  - `should_continue_on_error` (ray-project/ray PR #59212, for issues #59194 and #57140: "one bad prompt kills the
    entire batch"): under --on-error skip a session whose replay raises is recorded in run.json `errors` and skipped.
  - The resiliency thread ray-project/ray#59522 (item 1: one dead vLLM engine shuts the whole job down) and PR #60145
    (actor methods are bound to one actor, so a retry must reach another one): a replica that dies (its process
    killed, out of memory, its node lost) is replaced by a new actor, and its session goes back to the front of the
    queue for whichever replica is free, at most `max_attempts` times; a session that kills every replica it reaches
    is then a failing session (skipped under --on-error skip). Item 2 (a spot node lost takes the object store's
    objects with it): each result is fetched as soon as it is ready and written within parts.GROUP_SECONDS; a result
    lost before that is one more attempt.

Dispatch: sessions are rendered here first (the driver needs every session's tokens: the order and the progress
total), each put in the object store, then fed to free replicas longest first (the longest-processing-time rule:
no replica ends with one huge session left). With a drafter whose state spans sessions (suffix decoding's global
tree: suffix, hybrid, hybrid_longer) the order is the input order instead, and each replica, before drafting a
session, adds the recorded outputs of every earlier session it has not seen (replayed elsewhere, another shard's,
or finished in an earlier run) to its tree — exactly the sessions before it, as in a single process; a replacement
replica starts from the first session. The progress line counts tokens across the whole job (Observer.replayed).
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OptionError, UserError

MAX_ATTEMPTS = 3  # a session is given to a replica at most this many times when replicas die under it


@dataclass(frozen=True)
class Fault:
    """A test hook (tests/test_cluster.py): a replica replaying a session of `once` exits at once (os._exit, as a
    killed process does) the first time — it leaves a marker file in the directory `markers` —, one of `always` every
    time."""

    once: tuple[str, ...] = ()
    always: tuple[str, ...] = ()
    markers: str | None = None

    def strike(self, session_id: str) -> None:
        if session_id in self.once:
            marker = Path(self.markers) / f"killed-{session_id}"
            if marker.exists():
                return
            marker.touch()
        elif session_id not in self.always:
            return
        os._exit(1)  # as the kernel's OOM killer or a lost node ends it: no cleanup, no reply

    @classmethod
    def from_environ(cls) -> "Fault | None":
        """The hook as the command line's tests set it (FAULT_ENV: JSON {"once": [...], "always": [...], "markers":
        DIR}); None when it is not set — always, outside the tests."""
        import json

        text = os.environ.get(FAULT_ENV)
        if not text:
            return None
        given = json.loads(text)
        return cls(once=tuple(given.get("once", ())), always=tuple(given.get("always", ())), markers=given.get("markers"))


FAULT_ENV = "MTP_OBSERVE_TEST_RAY_FAULT"  # tests/test_cluster_cli.py: kill a replica of a `replay --ray` run


@dataclass(frozen=True)
class RayOptions:
    address: str = "local"  # local (start a cluster on this machine), auto (the running one), ray://HOST:PORT
    replicas: int | None = None  # None: as many as the cluster's GPUs hold at gpus_per_replica each (1 without GPUs)
    gpus_per_replica: float | None = None  # None: 1 when the cluster has GPUs and the target runs, else 0
    max_attempts: int = MAX_ATTEMPTS
    fault: Fault | None = None  # tests only


def check_address(address: str) -> str:
    if address in ("local", "auto") or (address.startswith("ray://") and len(address) > len("ray://")):
        return address
    raise OptionError(f"--ray {address}: expected local (start Ray on this machine), auto (join the cluster this "
                      "machine belongs to) or ray://HOST:PORT (a Ray client address)")


def connect(options: RayOptions, device: str, model_free: bool) -> "Cluster":
    """Join Ray — or start it, for `local` — and resolve the replicas. An already initialised Ray (a caller's own
    `ray.init`) is used as it is and left running."""
    import logging

    check_address(options.address)
    if options.replicas is not None and options.replicas < 1:
        raise OptionError(f"--replicas {options.replicas}: at least 1")
    if options.gpus_per_replica is not None and options.gpus_per_replica < 0:
        raise OptionError(f"--gpus-per-replica {options.gpus_per_replica:g}: expected 0 or more")
    if options.max_attempts < 1:
        raise OptionError(f"max_attempts {options.max_attempts}: at least 1")
    if device.startswith("cuda:"):
        raise OptionError(f"--device {device} with --ray: Ray gives each replica its own GPUs (--gpus-per-replica); "
                          "pass --device auto or cuda")
    try:
        import ray
    except ImportError:
        raise OptionError("--ray needs Ray, an optional extra: pip install 'mtp-observe[ray]' (or pip install ray)") from None
    started = False
    if options.address.startswith("ray://") and not ray.is_initialized():
        try:  # what Ray checks before it builds a client (ray/_private/utils.py, get_ray_client_dependency_error)
            import grpc  # noqa: F401
        except ImportError:
            raise OptionError(f"--ray {options.address}: a ray:// address needs the Ray client, which this Ray install "
                              "lacks (grpcio); pip install 'mtp-observe[ray]' (it brings ray[client]) or "
                              "pip install 'ray[client]'")
    if not ray.is_initialized():
        kwargs = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        try:
            ray.init(address=options.address, **kwargs)  # "local": always a new cluster here (Ray's own meaning)
        except (ConnectionError, RuntimeError, ValueError) as e:
            hint = ("start one with `ray start --head` on this machine, or pass --ray local" if options.address == "auto"
                    else "check the address and that the cluster's Ray client server is running")
            raise OptionError(f"--ray {options.address}: cannot connect ({str(e).splitlines()[0][:160] if str(e) else type(e).__name__}); "
                              f"{hint}") from None
        started = True
    try:
        resources = ray.cluster_resources()
        total_gpus = float(resources.get("GPU", 0))
        gpus = options.gpus_per_replica
        if gpus is None:
            gpus = 1.0 if total_gpus > 0 and not model_free and device != "cpu" else 0.0
        if gpus > 0 and model_free:
            raise OptionError(f"--gpus-per-replica {gpus:g}: a replay of model-free drafters only runs on the CPU; drop it")
        if gpus > 0 and device == "cpu":
            raise OptionError(f"--gpus-per-replica {gpus:g} with --device cpu: pass one of them")
        if gpus > total_gpus:
            raise OptionError(f"--gpus-per-replica {gpus:g}: the Ray cluster has {total_gpus:g} GPU(s); a replica's GPUs "
                              "must be on one node (device_map spreads the target over one process's GPUs)")
        total_cpus = float(resources.get("CPU", 0))
        replicas = options.replicas
        if replicas is None:
            replicas = max(int(total_gpus // gpus), 1) if gpus > 0 else 1
        # Every replica is an actor of one CPU (and its GPUs): more than the cluster holds would wait for resources
        # forever, in silence (Ray queues the actor). Refused here, naming what Ray has; an autoscaling cluster is
        # judged by what it holds when the job starts.
        if replicas > total_cpus:
            raise OptionError(f"--replicas {replicas}: the Ray cluster has {total_cpus:g} CPU(s) and each replica takes "
                              f"one, so {replicas - int(total_cpus)} would wait forever; pass --replicas "
                              f"{max(int(total_cpus), 1)} or fewer, or add nodes")
        if gpus > 0 and replicas * gpus > total_gpus:
            raise OptionError(f"--replicas {replicas} with --gpus-per-replica {gpus:g}: the Ray cluster has "
                              f"{total_gpus:g} GPU(s), so not every replica could start; pass --replicas "
                              f"{max(int(total_gpus // gpus), 1)} or fewer, or add nodes")
        return Cluster(options, replicas, gpus, "cuda" if gpus > 0 else "cpu", started)
    except BaseException:
        if started:
            ray.shutdown()
        raise


class Replica:
    """One model replica (a Ray actor): the target and the head loaded once, the roster's drafters, and what suffix
    decoding's tree has been fed so far (`fed`: the input index of the last session it saw)."""

    def __init__(self, model_dir: str, opts, device: str, dtype: str | None, fault: Fault | None = None):
        from ..drafting.whatif_heads import head_whatifs
        from ..model.checkpoint import read_checkpoint
        from ..model.loading import DTYPES, load_model
        from ..model.routing import RouterRecorder
        from .options import drafter_roster, head_variants, serving_for

        self.opts, self.fault = opts, fault
        self.roster = drafter_roster(opts)
        device_map = "auto" if device == "cuda" and _visible_gpus() > 1 else opts.device_map
        self.model = (load_model(model_dir, device=device, dtype=DTYPES[dtype], device_map=device_map,
                                 head_engine=opts.head_engine,
                                 serving=serving_for(opts, read_checkpoint(model_dir)))
                      if self.roster.needs_model else None)
        self.variants = head_variants(opts, self.model.info if self.model is not None else None)  # trees, layer rules
        self.whatifs = head_whatifs(opts, self.model)  # the head at each --head-precision, built once per replica
        self.recorder = RouterRecorder(self.model.target, opts.k + 1) if self.model is not None else None
        if self.recorder is not None and not self.recorder.active:
            self.recorder.close()
            self.recorder = None

    def ready(self) -> int:
        return os.getpid()

    def replay(self, task: "Task", earlier: list) -> dict:
        """One session: first the recorded outputs of the earlier sessions this replica has not seen (object refs of
        [(tokens [n] int32, spans [S, 2])], in input order), then its rows. A failure of the session itself comes back
        as {"error": message}; the replica stays."""
        import ray

        from .requests import session_parts

        for ref in earlier:
            for tokens, spans in ray.get(ref):
                self.roster.add_outputs(tokens, spans)
        if self.fault is not None:
            self.fault.strike(task.session_id)
        try:
            positions, requests, counts = session_parts(self.model, task.session_id, task.index, task.requests, self.opts,
                                                        self.roster, task.recorded, task.source, task.speculative,
                                                        self.recorder, None, task.where, self.variants, self.whatifs)
        except UserError as e:
            return {"error": str(e)}
        except Exception as e:  # the session failed here; the job decides (--on-error)
            return {"error": f"{task.where}: session {task.session_id}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        drafting = self.roster.timing() if tuple(self.roster.names) != ("mtp",) else {}
        return {"positions": positions, "requests": requests, "counts": counts, "drafting": drafting}


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@dataclass(frozen=True)
class Task:
    """One session to replay, rendered by the driver (what a replica needs of it, nothing of its text)."""

    index: int  # input index (requests.parquet session_index)
    session_id: str
    where: str  # file:line
    requests: tuple  # rendering.Request
    tokens: int  # every request's tokens (the order and the progress)
    recorded: object = None  # target.SamplingProfile `recorded` (None without a target)
    source: str | None = None
    speculative: object = None


@dataclass
class _Slot:
    """A replica handle and what the driver knows of it."""

    actor: object
    fed: int = -1  # the input index up to which its tree holds every session (stateful drafters)
    busy: bool = False
    key: int = 0  # its number, for its drafting time


@dataclass
class Cluster:
    options: RayOptions
    replicas: int
    gpus_per_replica: float
    device: str
    started: bool  # this process started or joined Ray (close lets go of it)
    replaced: int = 0
    retried: int = 0
    _slots: list = field(default_factory=list)

    def close(self) -> None:
        import ray

        self.close_replicas()
        if self.started and ray.is_initialized():
            ray.shutdown()

    def manifest(self) -> dict:
        """run.json `cluster` (tables.py, version 3)."""
        return {"engine": "ray", "address": self.options.address, "replicas": self.replicas,
                "gpus_per_replica": self.gpus_per_replica, "max_attempts": self.options.max_attempts,
                "replaced": self.replaced, "retried": self.retried}

    def replay(self, files, out: Path, opts, model_dir: Path, dtype, observer, fallback, roster, plan=None) -> dict:
        """Replay the input's sessions (the shard's, with plan) on the replicas; write their parts here (module doc)."""
        from . import parts

        writer = parts.PartWriter(out, max_sessions=opts.part_sessions)
        try:
            result = self._replay(files, out, opts, model_dir, dtype, observer, fallback, roster, plan, writer)
        except BaseException:
            try:
                writer.flush()
            except Exception:
                pass
            raise
        finally:
            self.close_replicas()
        writer.flush()
        _check_written(out, opts.k, *result.pop("expected"))
        return result

    def close_replicas(self) -> None:
        import ray

        for slot in self._slots:
            try:
                ray.kill(slot.actor)
            except Exception:
                pass
        self._slots = []

    def _new_actor(self, model_dir: Path, opts, dtype):
        import ray

        actor = ray.remote(num_cpus=1, num_gpus=self.gpus_per_replica, max_restarts=0)(Replica)
        dtype_name = str(dtype).removeprefix("torch.") if dtype is not None else None
        return actor.remote(str(model_dir), opts, self.device, dtype_name, self.options.fault)

    def _replay(self, files, out: Path, opts, model_dir: Path, dtype, observer, fallback, roster, plan, writer) -> dict:
        from ..sessions.inputs import Inputs

        inputs = Inputs.of(files, opts.max_sessions)  # the sessions the pipeline already read (or these paths)
        # 1. Every session read and rendered here, in input order: what is whose, what is finished, what to replay.
        survey = _survey(inputs, out, opts, model_dir, observer, fallback, roster, plan)
        order = dispatch_order(survey.tasks, roster.stateful)
        # 2. The replicas: every one loads the model, in parallel; a replica that cannot start is the job's error.
        self._start_replicas(model_dir, opts, dtype, len(order))
        tally = survey.tally
        observer.start(len(order) + len(survey.kept) + tally.counts["sessions_skipped"],
                       tokens=sum(t.tokens for t in order) + sum(n for _, n in survey.kept))
        for sid, tokens in survey.kept:
            observer.session(sid, tokens, skipped=False)
        for e in tally.errors:
            observer.session(e["session_id"] or "?", 0, skipped=True)
        started = time.time()
        # 3. Feed free replicas; take each result as it comes: write it, or retry it elsewhere, or record it.
        drafting = self._drive(order, survey, model_dir, opts, dtype, observer, writer, roster.stateful)
        timing: dict = {}
        for t in drafting.values():
            for part, x in t.items():
                total = timing.setdefault(part, {"seconds": 0.0, "anchors": 0})
                total["seconds"] = round(total["seconds"] + x["seconds"], 3)
                total["anchors"] += x["anchors"]
        return {"counts": tally.counts, "errors": tally.errors, "per_file": tally.per_file,
                "fresh_tokens": tally.fresh_tokens, "wall_s": time.time() - started, "drafting": timing,
                "cluster": self.manifest(), "expected": (survey.expected, survey.draft_ks)}

    def _start_replicas(self, model_dir: Path, opts, dtype, sessions: int) -> None:
        import ray
        from ray.exceptions import RayActorError

        self._slots = [_Slot(self._new_actor(model_dir, opts, dtype), key=i) for i in range(min(self.replicas, sessions))]
        try:
            ray.get([s.actor.ready.remote() for s in self._slots])
        except RayActorError as e:
            raise OptionError(f"a replica could not start ({_cause(e)}); check --model and that a replica's "
                              f"{self.gpus_per_replica:g} GPU(s) hold it (docs/scale.md)") from None

    def _drive(self, order: list, survey: "Survey", model_dir: Path, opts, dtype, observer, writer,
               stateful: bool) -> dict:
        """Feed free replicas until every task is written, retried elsewhere or recorded as failed; the drafting
        times of each replica (by its key)."""
        import numpy as np
        import ray
        from ray.exceptions import ObjectLostError, OwnerDiedError, RayActorError

        tally, feeds = survey.tally, survey.feeds
        refs = {t.index: ray.put(t) for t in survey.tasks}
        queue = deque(order)
        attempts: dict[int, int] = {}
        drafting: dict[int, dict] = {}
        in_flight: dict = {}  # ObjectRef -> (slot, task)
        feed_index = [i for i, _ in feeds]
        next_key = len(self._slots)

        def submit(slot: _Slot, task: Task) -> None:
            earlier = []
            if stateful:  # the outputs of every session in (slot.fed, task.index), in input order
                lo, hi = np.searchsorted(feed_index, slot.fed, side="right"), np.searchsorted(feed_index, task.index)
                earlier = [ref for _, ref in feeds[lo:hi]]
            slot.busy = True
            in_flight[slot.actor.replay.remote(refs[task.index], earlier)] = (slot, task)

        def fail_session(task: Task, message: str) -> None:
            if opts.on_error == "fail":
                raise UserError(message)
            tally.skip(observer, task.index, task.where.rsplit(":", 1)[0], int(task.where.rsplit(":", 1)[1]),
                       task.session_id, message, said=False)
            observer.session(task.session_id, 0, skipped=True)

        while queue or in_flight:
            for slot in self._slots:
                if slot.busy or not queue:
                    continue
                pick = next((t for t in queue if t.index > slot.fed), None) if stateful else queue[0]
                if pick is None:
                    continue
                queue.remove(pick)
                submit(slot, pick)
            assert in_flight, "a queued session no replica can take"
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            slot, task = in_flight.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except (RayActorError, ObjectLostError, OwnerDiedError) as e:  # the replica died (or its result is lost)
                attempts[task.index] = attempts.get(task.index, 0) + 1
                self.replaced += 1
                if self.replaced > self.options.max_attempts * max(self.replicas, 1) + len(order):
                    raise UserError(f"replicas keep dying ({self.replaced} replaced; the last: {_cause(e)}); check the "
                                    "nodes' memory and logs (ray logs), then continue with the same command and --resume")
                self._slots[self._slots.index(slot)] = _Slot(self._new_actor(model_dir, opts, dtype), key=next_key)
                next_key += 1
                if attempts[task.index] >= self.options.max_attempts:
                    fail_session(task, f"{task.where}: session {task.session_id}: the replica replaying it died "
                                       f"{attempts[task.index]} times ({_cause(e)}); it is too large for a replica "
                                       "(docs/scale.md: memory per replica) or crashes it")
                else:
                    self.retried += 1
                    queue.appendleft(task)
                continue
            slot.busy = False
            slot.fed = max(slot.fed, task.index)
            if "error" in result:
                fail_session(task, result["error"])
                continue
            writer.add(task.index, result["positions"], result["requests"])  # parts.py groups and writes them
            survey.expected.add(task.session_id)
            drafting[slot.key] = result["drafting"]
            tally.add(result["counts"])
            tally.fresh_tokens += result["counts"]["tokens_replayed"]
            observer.replayed(task.session_id, result["counts"]["tokens_replayed"], result["counts"]["requests"])
        return drafting


@dataclass
class Survey:
    """What the driver knows before any replica starts: the tasks, the outputs a stateful drafter is fed, a resumed
    run's finished sessions, the counts so far."""

    tasks: list  # [Task] to replay, in input order
    feeds: list  # [(input index, object ref of its outputs)], every renderable session, for a stateful drafter
    kept: list  # [(id, tokens)] of a resumed run's finished sessions
    expected: set  # the sessions the run directory must hold at the end
    tally: object  # manifest.Tally
    draft_ks: object  # options.written_draft_ks: the rows a part holds


def _survey(inputs, out: Path, opts, model_dir: Path, observer, fallback, roster, plan) -> Survey:
    import numpy as np
    import ray

    from ..model.checkpoint import read_checkpoint
    from ..model.target import VLLM_DEFAULTS, generation_config_profile
    from ..sessions.reading import SessionError, Skipped, input_name, speculative_steps
    from ..sessions.rendering import Renderer
    from . import parts, tables
    from .manifest import COUNT_KEYS, MAX_KEYS, Tally
    from .options import head_variants, session_sampler, written_draft_ks
    from .shards import session_key

    target, stateful = roster.needs_model, roster.stateful
    variants = head_variants(opts, read_checkpoint(model_dir) if target else None)  # what the replicas replay too
    renderer = Renderer.from_model_dir(model_dir, vocab_size=_vocab(model_dir) if target else None,
                                       overrides=opts.template)
    renderer.turn_errors = opts.on_error
    server_default = (generation_config_profile(model_dir) or VLLM_DEFAULTS) if target else None
    draft_ks = written_draft_ks(opts, roster, variants)  # the rows a part holds, as a process's replay checks them
    finished = parts.finished_sessions(out, opts.k, draft_ks,
                                       on_damaged=lambda path, why:
                                       observer.note(f"{path}: {why}; recomputing its sessions"))
    tally = Tally(dict.fromkeys(COUNT_KEYS + MAX_KEYS, 0), [], {input_name(f): 0 for f in inputs.files})
    survey = Survey([], [], [], set(), tally, draft_ks)

    def outputs(requests) -> list:
        return [(np.asarray(r.input_ids, dtype=np.int32),
                 np.array([(sp.start, sp.end) for sp in r.spans], dtype=np.int64).reshape(-1, 2)) for r in requests]

    for item in inputs.items(opts.on_error):
        tally.per_file[item.path] += 1
        if plan is not None and not plan.owns(session_key(item)):
            if stateful and not isinstance(item, Skipped):
                try:
                    survey.feeds.append((item.index, ray.put(outputs(renderer.render(item).requests))))
                except SessionError:
                    pass
            continue
        if isinstance(item, Skipped):
            tally.skip(observer, item.index, item.path, item.line, item.session_id, item.message, said=False)
            continue
        if item.id in finished:
            c = finished[item.id].counts
            tally.add(c)
            survey.expected.add(item.id)
            survey.kept.append((item.id, c["tokens_replayed"]))
            if stateful:
                survey.feeds.append((item.index, ray.put(tables.part_requests(out, finished[item.id].part, item.id))))
            continue
        try:
            rendered = renderer.render(item)
            recorded, source = session_sampler(item, fallback, server_default) if target else (None, None)
            speculative = speculative_steps(item)
        except SessionError as e:
            if opts.on_error == "fail":
                raise
            tally.skip(observer, item.index, e.path, e.line, e.session_id, str(e), said=False)
            continue
        tally.skip_turns(observer, item.index, item, rendered.skipped_turns)
        survey.tasks.append(Task(item.index, item.id, f"{item.path}:{item.line}", rendered.requests, rendered.n_tokens,
                                 recorded, source, speculative))
        if stateful:
            survey.feeds.append((item.index, ray.put(outputs(rendered.requests))))
    return survey


def dispatch_order(tasks: list[Task], stateful: bool) -> list[Task]:
    """The order sessions go to free replicas: longest first (ties in input order) — or, with a drafter whose state
    spans sessions, input order (module doc)."""
    return sorted(tasks, key=lambda t: t.index if stateful else (-t.tokens, t.index))


def _vocab(model_dir: Path) -> int | None:
    from ..model.checkpoint import read_checkpoint

    return read_checkpoint(model_dir).geometry.vocab_size


def _cause(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = next((line.strip() for line in text if line.strip()), type(e).__name__)
    return first[:200]


def _check_written(out: Path, k: int, expected: set[str], draft_ks: list[int] | None) -> None:
    """The run directory holds every session once, each part whole with the rows a replay of these options writes
    (draft_ks: options.written_draft_ks, as --resume checks them) — what merge checks of its shards."""
    from .merge import sessions_of

    held = sessions_of(out, {"k": k}, draft_ks=draft_ks)
    assert set(held) == expected, (f"the run holds {len(held)} sessions, {len(expected)} were written: "
                                   f"{sorted(set(held) ^ expected)[:3]}")
