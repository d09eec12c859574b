"""Generation: the target's own completions in the recorded contexts (`mtp-observe generate`).

Why: most recorded logs were written by another model, and acceptance against foreign text does not
predict serving (the report calls such a run UNRELIABLE). The honest measurement is on the target's own
text: for every assistant turn of every session, this module renders the recorded context with the chat
template and the generation prompt — exactly the tokens `replay` scores that turn against — lets the
target complete it with a known sampler, and writes the result as token-level records that `replay`
scores as they are and whose meta.sampling tells the report the traffic's recording sampler.

Contract:
    generate(files, model_dir, output, opts, observer) -> Summary
        the command: sessions in, token-level records out (one per session, a request per turn)

The decoding itself (batched turns, the sampler, the speculative loop) is decoding.py.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CheckpointError, InputError, OptionError
from ..model.target import SamplingProfile
from ..sessions.reading import MAX_SPECULATIVE_K, Skipped
from .decoding import (
    WINDOW_BATCHES,
    Completion,
    NonFiniteLogits,
    Settings,
    TurnPrompt,
    generate_batch,
    resolve_profile,
    speculative_turn,
    turn_prompts,
)
from .served import ServedEngine, check_engine_options, served_identity

# ---------------------------------------------------------------------------------------------
# 1. The prompts


# ---------------------------------------------------------------------------------------------
# 2. Sampling


# ---------------------------------------------------------------------------------------------
# 3. Batched generation with the target's cache


# ---------------------------------------------------------------------------------------------
# 4. The speculative loop


# ---------------------------------------------------------------------------------------------
# 5. The records: what `replay` reads back


def output_record(session, prompts: list[TurnPrompt], completions: list[Completion], identity: dict,
                  sampling: dict) -> tuple[dict | None, list[dict]]:
    """One token-level record for a session ({"id", "requests", "meta"}), and the turns left out.

    A turn whose completion is a single token (the end-of-turn token alone) is left out: a token-level
    request needs two completion tokens (the first has no anchor before it to be drafted from), and so a
    session none of whose turns has two is no record at all (None)."""
    requests, turns, stops, dropped, spec = [], [], [], [], []
    for prompt, completion in zip(prompts, completions):
        if len(completion.tokens) < 2:
            dropped.append({"turn": prompt.turn, "reason": f"a {len(completion.tokens)}-token completion "
                            f"({completion.stop}): nothing to draft"})
            continue
        requests.append({"prompt_token_ids": list(prompt.prompt), "completion_token_ids": list(completion.tokens)})
        turns.append(prompt.turn)
        stops.append(completion.stop)
        spec.append(completion)
    generated = {**identity, "source": {"file": _text(session.path), "line": session.line, "session_id": _text(session.id)},
                 "turns": turns, "stop": stops, "dropped": dropped}
    meta = {"generated": generated, "sampling": sampling}
    if identity.get("speculative_k") is not None:
        meta["speculative"] = {"k": identity["speculative_k"], "anchors": [list(c.anchors) for c in spec],
                               "accepted": [list(c.accepted) for c in spec]}
    if not requests:
        return None, dropped
    return {"id": _text(session.id), "requests": requests, "meta": meta}, dropped


def _text(value: str) -> str:
    """A string JSON can carry as UTF-8: a lone surrogate (undecodable bytes of a file name, which default ids
    come from) is written as its escape (literal.visible), since the reader refuses lone surrogates."""
    from ..literal import visible

    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return visible(value)


# ---------------------------------------------------------------------------------------------
# 6. The command


@dataclass(frozen=True)
class GenerateOptions:
    sampling: str = "generation_config"  # greedy, a built-in profile, generation_config, or NAME=T,TOP_P,TOP_K[,...]
    max_new_tokens: int = 1024
    seed: int | None = 0  # None: --engine vllm without --seed (the server's engine-wide generator draws)
    speculative: int | None = None  # K
    batch_size: int = 8
    chunk_size: int = 2048
    device: str = "auto"
    dtype: str = "auto"
    on_error: str = "fail"
    resume: bool = False
    overwrite: bool = False  # replace a finished output (atomically, once the new one is whole)
    template: object = None  # sessions.templates.TemplateOverrides
    shard: object = None  # shards.Shard (--shard I/N, --shard-by): generate that shard's sessions only
    max_sessions: int | None = None  # the first N sessions of the input (in input order, as replay counts them)
    engine: str = "transformers"  # served.ENGINES: who samples the completions
    engine_url: str | None = None  # --engine vllm: the server's address


class Observer:
    """Progress callbacks; the CLI draws a progress line from them. The default does nothing."""

    def estimate(self, estimate) -> None:
        """The work ahead (estimate.Estimate), before the first turn; said as generate's first line. Not made for an
        observer that does not override this (its calibration costs seconds)."""

    def start(self, turns: int) -> None: ...

    def prefilled(self, n: int) -> None:
        """n more prompt tokens are prefilled (a chunk; padding not counted)."""

    def generated(self, n: int) -> None:
        """n more tokens are generated (a step: one per row still generating; speculative: the step's kept tokens)."""

    def turns(self, turns: int, tokens: int) -> None:
        """A batch of turns ended, with its generated tokens (already heard step by step)."""

    def warn(self, message: str) -> None: ...

    def note(self, message: str) -> None: ...


@dataclass(frozen=True)
class Summary:
    output: Path
    profile: SamplingProfile
    sessions: int  # records written by this run
    kept: int  # records already in a resumed output
    turns: int  # turns generated by this run (kept ones too, dropped ones too)
    tokens: int  # tokens generated by this run
    prompt_tokens: int  # prompt tokens this run prefilled (every turn's whole prompt: no prefix is shared between turns)
    dropped: int  # turns left out (a one-token completion)
    skipped: tuple = ()  # sessions.Skipped: bad sessions (--on-error skip) and sessions with nothing to score
    wall_s: float = 0.0
    written: bool = True  # False: a shard that owns no session writes no output file

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else float("nan")


def check_options(opts: GenerateOptions) -> None:
    if opts.max_new_tokens < 2:
        raise OptionError(f"--max-new-tokens {opts.max_new_tokens}: at least 2 (a turn needs two tokens to be drafted: "
                          "the first has no anchor before it)")
    if opts.speculative is not None and not 1 <= opts.speculative <= MAX_SPECULATIVE_K:
        raise OptionError(f"--speculative {opts.speculative}: draft 1 to {MAX_SPECULATIVE_K} tokens per step")
    if opts.batch_size < 1:
        raise OptionError(f"--batch-size {opts.batch_size}: at least 1")
    if opts.chunk_size < 1:
        raise OptionError(f"--chunk-size {opts.chunk_size}: at least 1")
    if opts.seed is not None and opts.seed < 0:
        raise OptionError(f"--seed {opts.seed}: expected an integer >= 0")
    check_engine_options(opts)
    if opts.max_sessions is not None and opts.max_sessions < 1:
        raise OptionError(f"--max-sessions {opts.max_sessions}: must be at least 1")
    if opts.on_error not in ("fail", "skip"):
        raise OptionError(f"--on-error {opts.on_error}: expected fail or skip")


def check_output_file(output: Path, opts: GenerateOptions) -> None:
    """Before any work: the output is a file name; an interrupted run's partial file needs --resume; a finished
    output needs --resume (add sessions to it) or --overwrite (replace it), as replay's --out does."""
    output = Path(output)
    partial = output.with_name(output.name + ".partial")
    if opts.resume and opts.overwrite:
        raise OptionError("--resume and --overwrite contradict each other; pass one")
    if output.is_dir():
        raise OptionError(f"-o {output}: is a directory; give the JSONL file to write (e.g. {output / 'own.jsonl'})")
    if partial.exists() and not opts.resume:
        raise OptionError(f"{partial}: an interrupted generate's output; continue it with --resume (the same inputs and "
                          "options), or delete it to start over")
    if output.exists() and not (opts.resume or opts.overwrite):
        raise OptionError(f"-o {output}: already exists; pass --resume to add sessions to it, --overwrite to replace it, "
                          "or another -o")


def identity_of(model, profile: SamplingProfile, opts: GenerateOptions, device: str, dtype, plan=None) -> dict:
    """What every record's meta.generated says about how it was made; a resumed output must share it. plan
    (shards.ShardPlan): the shard generated (`shard`: index, count, rule, input set), absent without --shard."""
    from .. import __version__
    from ..model.fingerprints import tokenizer_sha256, weights_fingerprint

    info = model.info
    return {
        "by": {"name": "mtp-observe generate", "version": __version__},
        "model": {"path": str(info.path.resolve()), "config_sha256": info.config_sha256,
                  "weights_sha256": weights_fingerprint(info)["sha256"], "tokenizer_sha256": tokenizer_sha256(info.path)},
        "profile": profile.name, "seed": opts.seed, "max_new_tokens": opts.max_new_tokens,
        "speculative_k": opts.speculative,
        "dtype": str(dtype).removeprefix("torch."), "device": device.split(":")[0],
        "rendering": opts.template.manifest() if opts.template is not None else None,
        **({"shard": {key: value for key, value in plan.manifest().items() if key != "session_ids"}}
           if plan is not None else {}),
    }


PER_SESSION = ("source", "turns", "stop", "dropped")  # meta.generated keys that are the session's own


def sampling_meta(profile: SamplingProfile, opts: GenerateOptions) -> dict:
    """meta.sampling: the profile under vLLM SamplingParams names (what replay's `recorded` profile reads), seed, max_tokens."""
    return {**profile.as_dict(), "seed": opts.seed, "max_tokens": opts.max_new_tokens}


class Output:
    """The output file while it is written: `<output>.partial`, locked, one line per session, renamed over
    `<output>` once every session is written. A killed run leaves the partial file; --resume continues it
    (from the output itself when there is no partial file: more sessions appended to a finished output)."""

    def __init__(self, output: Path, resume: bool, identity: dict, sampling: dict):
        self.output = output
        self.partial = output.with_name(output.name + ".partial")
        self.note: str | None = None  # what resuming noticed (a line cut short), for the user
        self.done: dict[str, int] = {}  # session ids already written -> their line in the file resumed
        self.written = 0  # records this run wrote
        self.created = not self.partial.exists()  # this run makes the partial file (nothing of an earlier run is in it)
        try:
            # 1. Take the partial file (an existing one only if no other generate holds it), locked until the end.
            self.file = open(self.partial, "xb" if self.created else "ab")
        except FileExistsError:
            raise OptionError(f"{self.partial}: another mtp-observe generate is writing it; wait for it or choose another -o") from None
        except OSError as e:
            raise OptionError(f"-o {output}: cannot write {self.partial} ({e.strerror}); choose another path") from None
        self._lock()
        try:
            # 2. What is already written: the partial file's complete lines, or (--resume) a finished output's.
            if not self.created and not resume:
                raise OptionError(f"{self.partial}: an interrupted generate's output; continue it with --resume (the same "
                                  "inputs and options), or delete it to start over")
            source = self.partial if not self.created else output if resume and output.exists() else None
            kept = self._read(source, identity, sampling) if source is not None else b""
            try:
                if source == self.partial:
                    self.file.truncate(len(kept))  # a last line cut short by a kill is dropped (generated again)
                else:
                    self.file.write(kept)
                self._sync()
            except OSError as e:
                raise OptionError(f"{self.partial}: cannot write ({e.strerror or e}); free space (or choose another -o), "
                                  "then run it again") from None
        except BaseException:
            self.close(failed=True)
            raise

    def _lock(self) -> None:
        import fcntl

        try:
            fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.file.close()
            raise OptionError(f"{self.partial}: another mtp-observe generate is writing it; wait for it or choose another -o") from None

    def _read(self, source: Path, identity: dict, sampling: dict) -> bytes:
        """The complete lines of the file to resume, checked to come from this run's settings; sets self.done."""
        data = source.read_bytes()
        end = data.rfind(b"\n") + 1  # a line with no newline was cut short
        lines = data[:end].split(b"\n")[:-1] if end else []
        for n, line in enumerate(lines, start=1):
            try:
                record = json.loads(line)
                generated = dict(record["meta"]["generated"])
                mine = {k: v for k, v in generated.items() if k not in PER_SESSION}
                theirs_sampling = record["meta"]["sampling"]
                sid = str(record["id"])
            except (ValueError, KeyError, TypeError):
                raise InputError(f"{source}:{n}: not a record mtp-observe generate wrote; --resume continues only its own "
                                 "output (choose another -o, or delete the file)") from None
            different = _difference(identity, mine) or ("the sampler differs" if theirs_sampling != sampling else None)
            if different is not None:
                raise OptionError(f"{source}: cannot resume, {different} ({source}:{n}); rerun with the same model and "
                                  "options, or choose another -o")
            self.done[sid] = n
        if end < len(data):
            cut = len(lines) + 1
            self.note = f"{source}:{cut}: a line cut short (an interrupted write) is dropped; its session is generated again"
        return data[:end]

    def write(self, record: dict) -> None:
        try:
            self.file.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
            self._sync()
            self.written += 1
        except OSError as e:
            raise OptionError(f"{self.partial}: cannot write ({e.strerror or e}); the sessions written before are kept: "
                              "free space, then continue with the same command and --resume") from None

    def _sync(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())

    def finish(self) -> None:
        """The whole output appears at once, under its name."""
        try:
            self.file.close()
            os.replace(self.partial, self.output)
        except OSError as e:
            raise OptionError(f"-o {self.output}: cannot finish it from {self.partial} ({e.strerror or e}); the sessions "
                              "written are kept there: free space, then continue with --resume") from None

    def close(self, failed: bool = False) -> None:
        """Let go of the file; a run that failed before writing a record removes the partial file it made (so that
        fixing the input and running again needs no --resume; what an earlier run wrote stays, for --resume). A
        close that fails (the buffer's last bytes meet the full disk again) loses only a line cut short, which
        --resume drops; the failure that stopped the run is what the user sees."""
        if not self.file.closed:
            try:
                self.file.close()
            except OSError:
                if not failed:
                    raise
        if failed and self.created and self.written == 0:
            self.partial.unlink(missing_ok=True)


def _difference(mine: dict, theirs: dict) -> str | None:
    for key in sorted(set(mine) | set(theirs)):
        if mine.get(key) != theirs.get(key):
            return f"{key.replace('_', ' ')} differs ({_short(theirs.get(key))} there, {_short(mine.get(key))} here)"
    return None


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass
class _Pending:
    """Sessions read and rendered, waiting for their turns' completions."""

    sessions: list = field(default_factory=list)  # [(Session, [TurnPrompt])]
    turns: int = 0


def generate(files, model_dir: Path, output: Path, opts: GenerateOptions, observer: Observer | None = None) -> Summary:
    """Generate the target's own completion of every assistant turn of every session; write token-level records.

    1. options, inputs, the model, the renderer and the sampler; the output (fresh, or --resume)
    2. count the turns still to generate (progress)
    3. read sessions until WINDOW_BATCHES batches of turns are pending; generate them in batches of similar
       prompt length (or one at a time under --speculative); write those sessions in input order; repeat
    4. rename the partial output over the output
    With opts.shard only the shard's sessions (shards.py: by id, or balanced by tokens) are generated: each shard of
    a scheduler array writes its own output, and the outputs together are the input of a replay.
    """
    from ..sessions.inputs import Inputs
    from ..sessions.rendering import Renderer
    from .shards import plan_shard, session_key

    observer = observer or Observer()
    check_options(opts)
    profile = resolve_profile(opts.sampling, model_dir)
    inputs = Inputs.of(files)  # read once: the shard plan, the survey and the loop take the same sessions
    if any(output.resolve() == Path(f).resolve() for f in inputs.files):
        raise OptionError(f"-o {output} is one of the input files; write the completions elsewhere")
    check_output_file(output, opts)
    model, device, dtype = _target(model_dir, opts)
    renderer = Renderer.from_model_dir(model.info.path, vocab_size=model.info.geometry.vocab_size, overrides=opts.template)
    renderer.turn_errors = opts.on_error  # skip: a turn the rendering cannot reconstruct is left out, not its session
    settings = Settings(profile=profile, max_new_tokens=opts.max_new_tokens, seed=opts.seed, eos_ids=renderer.eos_ids,
                        chunk_size=opts.chunk_size, speculative=opts.speculative)
    plan = plan_shard(inputs, opts.shard, renderer) if opts.shard is not None else None
    empty = plan.none_owned() if plan is not None else None
    resumed = opts.resume and (output.exists() or output.with_name(output.name + ".partial").exists())
    if empty is not None and not resumed:  # a success: no file is written (an empty one is refused as a replay input)
        replaced = opts.overwrite and output.exists()
        if replaced:
            output.unlink()
        observer.note(f"{empty}: nothing to generate, so -o {output} is not written"
                      + (" (the output --overwrite replaced is removed)" if replaced else "")
                      + "; the other shards' outputs are the whole input of a replay")
        return Summary(output=output, profile=profile, sessions=0, kept=0, turns=0, tokens=0, prompt_tokens=0,
                       dropped=0, written=False)

    def owns(item) -> bool:
        return plan is None or plan.owns(session_key(item))

    identity = identity_of(model, profile, opts, device, dtype, plan)
    if isinstance(model, _Served):
        identity = served_identity(identity, model.engine)
    sampling = sampling_meta(profile, opts)
    out = Output(output, opts.resume, identity, sampling)
    try:
        if out.note:
            observer.note(out.note)
        started = time.time()

        # 2. The turns still to generate, and their estimate; a resumed output holds sessions of these inputs only.
        shapes, ids = _survey(inputs, renderer, opts.max_sessions, out.done, owns)
        foreign = [sid for sid in out.done if sid not in ids]
        if foreign:
            raise OptionError(f"{out.partial if out.partial.exists() else output}: holds {len(foreign)} session(s) these "
                              f"inputs do not (e.g. {foreign[0]}); resume with the inputs it was generated from (more may "
                              "be added), or choose another -o")
        if type(observer).estimate is not Observer.estimate:  # the default drops it: no calibration for it
            observer.estimate(_estimate(model, settings, opts, shapes))
        observer.start(sum(len(turns) for turns in shapes))

        # 3. Sessions in, records out.
        writer = _Writing(model, settings, opts, observer, out, identity, sampling)
        writer.run(inputs, renderer, owns)
        counts, skipped = writer.counts, writer.skipped
        if counts["sessions"] == 0 and not out.done:
            raise InputError(f"no session was generated ({len(skipped)} skipped: {skipped[0].message if skipped else 'none'}); "
                             "fix the inputs, or pass others")
        out.finish()
    except NonFiniteLogits as e:
        from ..model.loading import non_finite_advice

        out.close(failed=True)
        raise CheckpointError(f"{model.info.path}: {e}; {non_finite_advice(dtype)}") from None
    except BaseException:
        out.close(failed=True)
        raise
    out.close()
    return Summary(output=output, profile=profile, sessions=counts["sessions"], kept=len(out.done), turns=counts["turns"],
                   tokens=counts["tokens"], prompt_tokens=counts["prompt_tokens"], dropped=counts["dropped"],
                   skipped=tuple(skipped), wall_s=time.time() - started)


@dataclass
class _Writing:
    """Step 3 of generate: sessions read until WINDOW_BATCHES batches of turns are pending, completed in batches,
    written in input order; what it counted and skipped."""

    model: object
    settings: Settings
    opts: GenerateOptions
    observer: Observer
    out: Output
    identity: dict
    sampling: dict
    counts: dict = field(default_factory=lambda: {"sessions": 0, "turns": 0, "tokens": 0, "prompt_tokens": 0,
                                                  "dropped": 0})
    skipped: list = field(default_factory=list)

    def skip(self, item, message: str) -> None:
        self.skipped.append(item if isinstance(item, Skipped) else
                            Skipped(item.path, item.line, item.id, message, item.index))
        self.observer.warn(message)

    def run(self, inputs, renderer, owns) -> None:
        from ..sessions.reading import SessionError

        opts = self.opts
        pending = _Pending()
        window = opts.batch_size * WINDOW_BATCHES if opts.speculative is None else 1
        for item in inputs.items(opts.on_error):
            if opts.max_sessions is not None and item.index >= opts.max_sessions:
                break
            if not owns(item):
                continue
            if isinstance(item, Skipped):
                self.skip(item, item.message)
                continue
            if item.id in self.out.done:
                continue
            try:
                rendered = inputs.rendered(item, renderer)
                prompts = turn_prompts(rendered)
                inputs.release(item)
                for _, message in rendered.skipped_turns:
                    self.observer.warn(message)
            except SessionError as e:
                if opts.on_error == "fail":
                    raise
                self.skip(Skipped(e.path, e.line, e.session_id, str(e), item.index), str(e))
                continue
            pending.sessions.append((item, prompts))
            pending.turns += len(prompts)
            if pending.turns >= window:
                self.flush(pending)
                pending = _Pending()
        if pending.sessions:
            self.flush(pending)

    def flush(self, pending: _Pending) -> None:
        counts = self.counts
        prompts = [p for _, ps in pending.sessions for p in ps]
        completions = _complete(self.model, prompts, self.settings, self.opts.batch_size, self.observer)
        i = 0
        for session, ps in pending.sessions:
            record, dropped = output_record(session, ps, completions[i : i + len(ps)], self.identity, self.sampling)
            i += len(ps)
            counts["dropped"] += len(dropped)
            if record is None:
                self.skip(session, f"{session.path}:{session.line}: session {session.id}: every turn's completion is a "
                                   "single token (the end-of-turn token alone), so nothing is left to score; it is left out")
                continue
            self.out.write(record)
            counts["sessions"] += 1
        counts["turns"] += len(prompts)
        counts["tokens"] += sum(len(c.tokens) for c in completions)
        counts["prompt_tokens"] += sum(len(p.prompt) for p in prompts)


def _survey(inputs, renderer, max_sessions: int | None, done, owns=lambda item: True) -> tuple[list, set]:
    """([the turns of each session to generate, as estimate.TurnShape], every session id of the input this run owns
    (owns: its --shard)): the sessions the loop below will generate (the first max_sessions, owned, not in `done`,
    rendering: the renderings are kept for the loop), in input order. inputs: sessions.inputs.Inputs."""
    from ..sessions.reading import SessionError, Skipped
    from .estimate import turn_shapes

    shapes, ids = [], set()
    for item in inputs.items("skip"):
        if isinstance(item, Skipped) or not owns(item):
            continue
        ids.add(item.id)
        if (max_sessions is not None and item.index >= max_sessions) or item.id in done:
            continue
        try:
            shapes.append(turn_shapes(inputs.rendered(item, renderer)))
        except SessionError:
            continue  # the loop skips it (or stops at it)
    return shapes, ids


def _estimate(model, settings: Settings, opts: GenerateOptions, shapes: list):
    """estimate.Estimate of generating those sessions, priced by a calibration on the model."""
    from .estimate import Estimate, calibrate_generate, generate_work

    work = generate_work(shapes, opts.batch_size, opts.chunk_size, opts.max_new_tokens, opts.speculative)
    if isinstance(model, _Served):
        return Estimate(work, max_new_tokens=opts.max_new_tokens,
                        why_no_time=f"no time estimate (vLLM {model.engine.version} at {model.engine.url} generates)")
    try:
        rates = calibrate_generate(model, settings, min(opts.batch_size, max(work.turns, 1)))
    except NonFiniteLogits:  # the run itself says so, with the fix
        return Estimate(work, max_new_tokens=opts.max_new_tokens,
                        why_no_time="no time estimate (the model's outputs are not finite)")
    return Estimate(work, rates, max_new_tokens=opts.max_new_tokens)


def generate_estimate(files, model_dir: Path, opts: GenerateOptions):
    """What `generate --dry-run` prints (estimate.Estimate): the work of generating the input's sessions (the first
    --max-sessions; a resumed output's too; under --shard I/N the shard's own), priced by a calibration on the model.
    Writes nothing."""
    from ..sessions.inputs import Inputs
    from ..sessions.rendering import Renderer
    from .shards import plan_shard, session_key

    check_options(opts)
    profile = resolve_profile(opts.sampling, model_dir)
    inputs = Inputs.of(files)
    model, _, _ = _target(model_dir, opts)
    renderer = Renderer.from_model_dir(model.info.path, vocab_size=model.info.geometry.vocab_size, overrides=opts.template)
    settings = Settings(profile=profile, max_new_tokens=opts.max_new_tokens, seed=opts.seed, eos_ids=renderer.eos_ids,
                        chunk_size=opts.chunk_size, speculative=opts.speculative)
    plan = plan_shard(inputs, opts.shard, renderer) if opts.shard is not None else None
    shapes, _ = _survey(inputs, renderer, opts.max_sessions, {},
                        (lambda item: True) if plan is None else (lambda item: plan.owns(session_key(item))))
    return _estimate(model, settings, opts, shapes)


def _complete(model, prompts: list[TurnPrompt], settings: Settings, batch_size: int, observer: Observer) -> list[Completion]:
    """Completions of prompts in their order: batches of similar length (shortest first), or one speculative turn at a time."""
    if isinstance(model, _Served):  # the server batches the requests in flight
        lock = threading.Lock()

        def done(completion: Completion) -> None:
            with lock:
                observer.generated(len(completion.tokens))
                observer.turns(1, len(completion.tokens))

        return model.engine.complete(prompts, settings.profile, settings.max_new_tokens, settings.eos_ids, settings.seed,
                                     batch_size, on_done=done)
    out: list[Completion | None] = [None] * len(prompts)
    if settings.speculative is not None:
        for i, p in enumerate(prompts):
            out[i] = speculative_turn(model, p, settings, observer=observer)
            observer.turns(1, len(out[i].tokens))
        return out
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i].prompt))
    for b0 in range(0, len(order), batch_size):
        batch = order[b0 : b0 + batch_size]
        for i, completion in zip(batch, generate_batch(model, [prompts[i] for i in batch], settings, observer=observer)):
            out[i] = completion
        observer.turns(len(batch), sum(len(out[i].tokens) for i in batch))
    return out



@dataclass(frozen=True)
class _Served:
    """generate's target when a vLLM server samples (--engine vllm): the engine, and the local checkpoint that
    renders the prompts (its tokenizer, chat template and end-of-turn ids)."""

    engine: ServedEngine
    info: object  # model.checkpoint.CheckpointInfo


def _target(model_dir: Path, opts: GenerateOptions):
    """(the target: model.loading.LoadedModel, or _Served, device, dtype): the model loaded here, or the server asked
    who it is (the weights stay on the server's side)."""
    from ..model.loading import load_model, resolve_device, resolve_dtype

    if opts.engine == "vllm":
        from ..model.checkpoint import read_checkpoint

        engine = ServedEngine.connect(opts.engine_url)
        return _Served(engine, read_checkpoint(model_dir)), "cpu", "none"
    device = resolve_device(opts.device)
    dtype = resolve_dtype(opts.dtype, device)
    return load_model(model_dir, device=device, dtype=dtype), device, dtype
