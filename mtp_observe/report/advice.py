"""The advice: why a verdict is UNRELIABLE, and the commands that get it out; what to run after a GO or a NO-GO.

Contract:
    facts_of(run, cost_source) -> Facts   what the commands need of a run (its path, inputs, model, profiles, K)
    unfinished(facts), partial_merge(facts), model_free(facts), sampler(facts, recording), too_few_sessions(facts, sessions, minimum),
    no_interval(facts, text) -> Cause     one UNRELIABLE cause each: a short reason, the full detail, the fix
    after_go(facts), after_no_go(facts) -> tuple[str, ...]
                                          the next steps of a verdict that is not UNRELIABLE

Every cause the judge (verdict.py) finds is kept, in this order: the run is unfinished, no target ran, the traffic
fits no sampler, too few sessions, no interval. A step is a command line to paste (paths shell-quoted, the run's
own inputs and model), optionally followed by two spaces, '#' and what it is for; views print them as they are
(through literal.py: the paths are the user's).

Why sessions, not turns (the --min-sessions rule): sessions differ far more than turns within one. Two sampled
loops over the same ten prompts (the bundled model, the same sampler, another seed) made 2.42 and 2.90 tokens per
step, a difference a bootstrap of turns inside two to seven sessions cannot see. metrics.MIN_SESSIONS_FOR_BOOTSTRAP
(10) is where a bootstrap over sessions starts to cover (90% real coverage of a nominal 95% at 10 sessions), so
it is the default; below it the estimates are shown with the turn-level interval, "within these sessions only".
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .metrics import MIN_SESSIONS_FOR_BOOTSTRAP, MIN_SESSIONS_FOR_VERDICT
from .recording import candidate_stats

if TYPE_CHECKING:
    from .recording import RecordingSampler
    from .run import Run

DEFAULT_MIN_SESSIONS = MIN_SESSIONS_FOR_BOOTSTRAP  # --min-sessions: the size a bootstrap over sessions needs
FLOOR_MIN_SESSIONS = MIN_SESSIONS_FOR_VERDICT  # --min-sessions below this is refused: one session says nothing of the next
CAUSES = ("unfinished", "model-free", "sampler", "sessions", "interval")  # the order they are listed in


@dataclass(frozen=True)
class Facts:
    """What the next-step commands are made of: the run's own path, inputs and model."""

    path: str  # the run directory
    inputs: tuple[str, ...]  # run.json inputs, as given to replay
    model: str | None  # run.json model.path
    bundled: bool  # the bundled model: the commands need no --model
    profiles: tuple[str, ...]  # the run's sampling profiles (what --recorded-with accepts)
    k: int  # Kmax replayed
    drafter: str  # the drafter judged
    cost_source: str  # "probe" | "draft-cost" | "roofline" | ... (denominator.Cost.source)


@dataclass(frozen=True)
class Cause:
    """One reason a verdict is UNRELIABLE, and its fix."""

    name: str  # one of CAUSES
    reason: str  # one short sentence for the first screen
    detail: str  # the same with every statistic (JSON, --details)
    steps: tuple[str, ...]  # commands that fix it, in order


def facts_of(run: "Run", cost_source: str) -> Facts:
    m = run.manifest
    model = m.get("model") or {}
    inputs = tuple(str(i.get("path")) for i in (m.get("inputs") or []) if isinstance(i, dict) and i.get("path"))
    return Facts(path=str(run.path), inputs=inputs, model=model.get("path"), bundled=bool(model.get("bundled")),
                 profiles=tuple(p for p in run.profiles if p != "recorded"), k=run.k, drafter=run.drafter,
                 cost_source=cost_source)


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
        reason = (f"the recorded tokens fit none of the {len(recording.candidates)} samplers of this target, so "
                  "acceptance against them does not predict serving")
    else:
        pick = recording.candidate(recording.name)
        reason = (f"the recorded tokens do not fit {recording.label}" + (f" ({candidate_stats(pick)})" if pick else "")
                  + ", so acceptance against them does not predict serving")
    own = "own.jsonl"
    steps = (f"mtp-observe generate {_inputs(f)}{_model(f)} -o {own}  # the target's own completions of these turns",
             f"mtp-observe replay {own}{_model(f)}{_k(f)}",
             "mtp-observe report")
    detail = recording.reason
    if f.profiles:
        steps += (f"mtp-observe report {_q(f.path)} --recorded-with PROFILE  # or: the sampler you know it was recorded with",)
        detail += f"; --recorded-with takes one of {', '.join(f.profiles)}"
    return Cause("sampler", reason, detail, steps)


def too_few_sessions(f: Facts, sessions: int, minimum: int) -> Cause:
    word = "session" if sessions == 1 else "sessions"
    return Cause(
        "sessions",
        f"{sessions} {word}, fewer than --min-sessions {minimum}: sessions differ far more than turns within one, "
        "so the numbers hold within these sessions only",
        f"{sessions} {word}, fewer than --min-sessions {minimum}: two sampled loops over the same ten prompts (same "
        "model and sampler, another seed) made 2.42 and 2.90 tokens per step, a difference a bootstrap of turns "
        f"within {sessions} {word} cannot see; replay at least {minimum} sessions",
        (f"mtp-observe replay MORE_SESSIONS.jsonl{_model(f)}{_k(f)}  # at least {minimum} sessions (this run has "
         f"{sessions}), then report",),
    )


def no_interval(f: Facts, text: str) -> Cause:
    return Cause("interval", text, text,
                 (f"mtp-observe replay MORE_SESSIONS.jsonl{_model(f)}{_k(f)}  # more sessions and turns, then report",))


def after_go(f: Facts, k: int) -> tuple[str, ...]:
    if k == 0:
        return ()
    return (f"mtp-observe export {_q(f.path)} --engine vllm -o vllm.json  # the config and the numbers vLLM should show",
            f"mtp-observe compare {_q(f.path)} --engine-metrics metrics.txt  # once served: the engine's own counters "
            "(its /metrics) against the run")


def after_no_go(f: Facts) -> tuple[str, ...]:
    if f.cost_source == "roofline":
        return (f"mtp-observe probe {_q(f.model) if f.model else 'MODEL'} -o probe.json  # on your GPU: the measured "
                "draft and verify cost instead of the roofline",
                f"mtp-observe report {_q(f.path)} --probe probe.json")
    return ()
