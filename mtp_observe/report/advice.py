"""The advice: why a verdict is UNRELIABLE, and the commands that get it out; what to run after a GO or a NO-GO.

Contract:
    facts_of(run, cost_source) -> Facts   what the commands need of a run (its path, inputs, model, profiles, K)
    unfinished(facts), partial_merge(facts), model_free(facts), sampler(facts, recording), too_few_sessions(facts, sessions, minimum),
    no_interval(facts, text) -> Cause     one UNRELIABLE cause each: a short reason, the full detail, the fix
    merge_step(path, count) -> str        the next step of a shard's run: merge it with the job's other shards
    after_go(facts), after_no_go(facts) -> tuple[str, ...]
                                          the next steps of a verdict that is not UNRELIABLE
    command(verb, *arguments, settings=..., **changes) -> str
                                          one mtp-observe command line that judges the run again (report, export,
                                          compare), carrying the report's own options in force (Settings), so the
                                          step reaches the verdict it is printed under
    free_output(inputs, stem="own") -> str
                                          an output name that exists nowhere yet and is none of the inputs

Every cause the judge (verdict.py) finds is kept, in this order: the run is unfinished, no target ran, the traffic
fits no sampler, too few sessions, no interval. A step is a command line to paste (paths shell-quoted, the run's
own inputs and model), optionally followed by two spaces, '#' and what it is for; views print them as they are
(through literal.py: the paths are the user's). A step that judges the run again (report, export, compare) is made
by `command` from the report's settings (--min-sessions, --recorded-with, --batch, --device-spec, --draft-cost,
--probe, --gate, ...): `report RUN --min-sessions 7` that says GO prints an `export` with `--min-sessions 7`, which
exits 0 as the GO promises (tests/test_advice.py runs every printed step).

Why sessions, not turns (the --min-sessions rule): sessions differ far more than turns within one. Two sampled
loops over the same ten prompts (the bundled model, the same sampler, another seed) made 2.42 and 2.90 tokens per
step, a difference a bootstrap of turns inside two to seven sessions cannot see. metrics.MIN_SESSIONS_FOR_BOOTSTRAP
(10) is where a bootstrap over sessions starts to cover (90% real coverage of a nominal 95% at 10 sessions), so
it is the default; below it the estimates are shown with the turn-level interval, "within these sessions only".
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .metrics import MIN_SESSIONS_FOR_BOOTSTRAP, MIN_SESSIONS_FOR_VERDICT, MIN_SUPPORT
from .recording import candidate_stats

if TYPE_CHECKING:
    from .recording import RecordingSampler
    from .run import Run

DEFAULT_MIN_SESSIONS = MIN_SESSIONS_FOR_BOOTSTRAP  # --min-sessions: the size a bootstrap over sessions needs
FLOOR_MIN_SESSIONS = MIN_SESSIONS_FOR_VERDICT  # --min-sessions below this is refused: one session says nothing of the next
CAUSES = ("unfinished", "model-free", "sampler", "sessions", "interval")  # the order they are listed in


@dataclass(frozen=True)
class Settings:
    """The report's options in force, as `report` (or `export`, `compare`) was given them; the defaults are the
    commands' own, and a default is never printed."""

    drafter: str | None = None  # --drafter (None: the commands' default)
    gate: str | None = None  # --gate, normalised ("speedup>=1.2"); None: informational
    min_sessions: int = MIN_SESSIONS_FOR_BOOTSTRAP  # --min-sessions
    recorded_with: str | None = None  # --recorded-with
    min_support: float = MIN_SUPPORT  # --min-support
    batch: str = "1"  # --batch B or LO-HI
    batch_sizes: tuple[int, ...] | None = None  # --batch-sizes
    device_spec: str | None = None  # --device-spec
    context: float | None = None  # --context
    probe: str | None = None  # --probe FILE
    draft_cost: float | None = None  # --draft-cost
    replicates: int = 1000  # --replicates
    seed: int = 0  # --seed


ROOFLINE_ONLY = ("batch_sizes", "device_spec", "context")  # what --probe and --draft-cost refuse beside them


def _number(x: float) -> str:
    return repr(float(x)) if float(x) != int(x) else str(int(x))


def options_of(s: Settings) -> list[str]:
    """The command-line options of s that differ from the defaults, in --help order, values shell-quoted."""
    d = Settings()
    pairs = [("--drafter", s.drafter, d.drafter), ("--gate", s.gate, d.gate),
             ("--min-sessions", s.min_sessions, d.min_sessions), ("--recorded-with", s.recorded_with, d.recorded_with),
             ("--min-support", s.min_support, d.min_support), ("--batch", s.batch, d.batch),
             ("--batch-sizes", ",".join(map(str, s.batch_sizes)) if s.batch_sizes else None, None),
             ("--device-spec", s.device_spec, d.device_spec), ("--context", s.context, d.context),
             ("--probe", s.probe, d.probe), ("--draft-cost", s.draft_cost, d.draft_cost),
             ("--replicates", s.replicates, d.replicates), ("--seed", s.seed, d.seed)]
    out = []
    for option, value, default in pairs:
        if value is None or value == default:
            continue
        text = _number(value) if isinstance(value, float) else str(value)
        out.append(f"{option} {text if text == 'PROFILE' else shlex.quote(text)}")
    return out


def command(verb: str, *arguments: str, settings: Settings = Settings(), **changes) -> str:
    """`mtp-observe VERB ARGUMENTS OPTIONS`: arguments as given (already quoted), then the settings with `changes`
    (a field set to another value, or None/its default to leave it out)."""
    s = replace(settings, **changes)
    return " ".join(["mtp-observe", verb, *arguments, *options_of(s)])


def free_output(inputs: tuple[str, ...], stem: str = "own", suffix: str = ".jsonl") -> str:
    """own.jsonl, else own-2.jsonl, own-3.jsonl, ...: the first name that exists nowhere yet (nor its .partial) and
    is none of the inputs (relative to where the commands run)."""
    taken = {os.path.realpath(i) for i in inputs}
    n = 1
    while True:
        name = f"{stem}{suffix}" if n == 1 else f"{stem}-{n}{suffix}"
        if not (os.path.lexists(name) or os.path.lexists(name + ".partial") or os.path.realpath(name) in taken):
            return name
        n += 1


@dataclass(frozen=True)
class Facts:
    """What the next-step commands are made of: the run's own path, inputs and model, the report's settings."""

    path: str  # the run directory
    inputs: tuple[str, ...]  # run.json inputs, as given to replay
    model: str | None  # run.json model.path
    bundled: bool  # the bundled model: the commands need no --model
    profiles: tuple[str, ...]  # the run's sampling profiles (what --recorded-with accepts)
    k: int  # Kmax replayed
    drafter: str  # the drafter judged
    cost_source: str  # "probe" | "draft-cost" | "roofline" | ... (denominator.Cost.source)
    settings: Settings = field(default_factory=Settings)  # the report's options in force
    drafters: tuple[str, ...] = ("mtp",)  # every drafter of the run (run.json order)
    max_sessions: int | None = None  # the replay's --max-sessions (the sessions it replayed)
    own: str = "own.jsonl"  # a name for generate's output that exists nowhere yet (free_output)


@dataclass(frozen=True)
class Cause:
    """One reason a verdict is UNRELIABLE, and its fix."""

    name: str  # one of CAUSES
    reason: str  # one short sentence for the first screen
    detail: str  # the same with every statistic (JSON, --details)
    steps: tuple[str, ...]  # commands that fix it, in order


def facts_of(run: "Run", cost_source: str, settings: Settings | None = None) -> Facts:
    from .run import run_drafters

    m = run.manifest
    model = m.get("model") or {}
    inputs = tuple(str(i.get("path")) for i in (m.get("inputs") or []) if isinstance(i, dict) and i.get("path"))
    limit = (m.get("options") or {}).get("max_sessions")
    return Facts(path=str(run.path), inputs=inputs, model=model.get("path"), bundled=bool(model.get("bundled")),
                 profiles=tuple(p for p in run.profiles if p != "recorded"), k=run.k, drafter=run.drafter,
                 cost_source=cost_source, settings=settings or Settings(), drafters=run_drafters(m),
                 max_sessions=limit if isinstance(limit, int) and not isinstance(limit, bool) else None,
                 own=free_output(inputs))


def _q(text: str) -> str:
    return shlex.quote(text)


def _inputs(f: Facts) -> str:
    return " ".join(_q(i) for i in f.inputs) if f.inputs else "SESSIONS.jsonl"


def _model(f: Facts) -> str:
    return f" --model {_q(f.model)}" if f.model and not f.bundled else ""


def _k(f: Facts) -> str:
    return "" if f.k == 4 else f" --k {f.k}"  # replay's default --k is 4


def unfinished(f: Facts, status: str) -> Cause:
    return Cause(
        "unfinished",
        f"the run's status is {status!r}: an unfinished run covers only the sessions written so far",
        f"run status is {status!r}: an unfinished run covers only the sessions written so far and is not a verdict; "
        "finish it with `mtp-observe replay ... --resume` (the first replay's inputs and options)",
        (f"mtp-observe replay {_inputs(f)}{_model(f)} --k {f.k} --out {_q(f.path)} --resume  "
         "# with the first replay's other options",),
    )


def partial_merge(f: Facts) -> Cause:
    """A run written by `merge --allow-partial` with shards or sessions missing (run.json merged.missing)."""
    return Cause(
        "unfinished",
        "a partial merge: shards or sessions are missing (run.json merged.missing)",
        "a partial merge (merge --allow-partial): shards or sessions are missing (run.json merged.missing), so it is "
        "not a verdict; finish the shards and merge every one",
        ("mtp-observe replay ... --shard I/N --resume  # each missing or unfinished shard, with its first options",
         f"mtp-observe merge SHARD... -o {_q(f.path)} --overwrite  # every shard, finished"),
    )


def merge_step(path: str, count: int) -> str:
    """The next step of a shard's run (run.json `shard`, not merged): join it with the job's other shards into one
    run (`mtp-observe merge`) and report that; a shard alone holds only its share of the sessions."""
    others = "OTHER_SHARD" if count == 2 else "OTHER_SHARDS..."
    return (f"mtp-observe merge {_q(path)} {others} -o MERGED_RUN  # the job's {count} shards into one run, then "
            "mtp-observe report MERGED_RUN")


def model_free(f: Facts, recording: "RecordingSampler") -> Cause:
    return Cause(
        "model-free",
        f"no target ran (a model-free replay): the numbers say how often {f.drafter}'s drafts equal the recorded "
        "tokens, not what serving would accept",
        recording.reason,
        (f"mtp-observe replay {_inputs(f)}{_model(f)} --drafters mtp,{f.drafter}  "
         "# with the target: the recording-sampler check",),
    )


def sampler(f: Facts, recording: "RecordingSampler") -> Cause:
    """The traffic fits no sampler (or not the declared one): regenerate it as the target's own, or declare it."""
    if recording.name is None:
        reason = (f"the recorded tokens fit none of the {len(recording.candidates)} samplers of this target: "
                  "no serving prediction")
    else:
        pick = recording.candidate(recording.name)
        reason = (f"the recorded tokens do not fit {recording.label}" + (f" ({candidate_stats(pick)})" if pick else "")
                  + ", so acceptance against them does not predict serving")
    own = f.own
    limit = f" --max-sessions {f.max_sessions}" if f.max_sessions is not None else ""  # the sessions the run replayed
    steps = (f"mtp-observe generate {_inputs(f)}{_model(f)}{limit} -o {_q(own)}  # own completions",
             f"mtp-observe replay {_q(own)}{_model(f)}{_k(f)}",
             command("report", settings=f.settings, recorded_with=None))  # the newest run: the replay's
    detail = recording.reason
    if f.profiles:
        steps += (command("report", _q(f.path), settings=f.settings, recorded_with="PROFILE") + "  # or: its known sampler",)
        detail += f"; --recorded-with takes one of {', '.join(f.profiles)}"
    return Cause("sampler", reason, detail, steps)


def too_few_sessions(f: Facts, sessions: int, minimum: int) -> Cause:
    word = "session" if sessions == 1 else "sessions"
    return Cause(
        "sessions",
        f"{sessions} {word}, fewer than --min-sessions {minimum}: the numbers hold within these sessions only",
        f"{sessions} {word}, fewer than --min-sessions {minimum}: two sampled loops over the same ten prompts (same "
        "model and sampler, another seed) made 2.42 and 2.90 tokens per step, a difference a bootstrap of turns "
        f"within {sessions} {word} cannot see; replay at least {minimum} sessions",
        (f"mtp-observe replay MORE_SESSIONS.jsonl{_model(f)}{_k(f)}  # at least {minimum} sessions (this run has "
         f"{sessions})", command("report", settings=f.settings)),
    )


def no_interval(f: Facts, text: str) -> Cause:
    return Cause("interval", text, text,
                 (f"mtp-observe replay MORE_SESSIONS.jsonl{_model(f)}{_k(f)}  # more sessions and turns",
                  command("report", settings=f.settings)))


def after_go(f: Facts, k: int) -> tuple[str, ...]:
    if k == 0:
        return ()
    # export exports the ranking's winner by default: name the drafter judged here when the run has several
    drafter = f.settings.drafter or (f.drafter if len(f.drafters) > 1 else None)
    return (command("export", _q(f.path), "--engine vllm -o vllm.json", settings=f.settings, drafter=drafter)
            + "  # vLLM's config and numbers",
            command("compare", _q(f.path), "--engine-metrics metrics.txt", settings=f.settings, drafter=drafter)
            + "  # once served: its counters")


def after_no_go(f: Facts) -> tuple[str, ...]:
    if f.cost_source == "roofline":
        return (f"mtp-observe probe {_q(f.model) if f.model else 'MODEL'} -o probe.json  # on your GPU: the measured "
                "draft and verify cost instead of the roofline",
                command("report", _q(f.path), settings=f.settings, probe="probe.json",
                        **{name: None for name in ROOFLINE_ONLY}))
    return ()


def distinct(steps) -> tuple[str, ...]:
    """The steps in order, a command already listed (its comment aside) left out: two causes with one fix print it once."""
    seen, out = set(), []
    for step in steps:
        line = step.split("  #", 1)[0]
        if line not in seen:
            seen.add(line)
            out.append(step)
    return tuple(out)
