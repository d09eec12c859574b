"""The input commands: `import` (logs to sessions), `sessions` (what a replay would score) and `generate` (the target's own completions)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..errors import OptionError
from ..literal import literal, visible
from ..wording import plural
from .common import (
    DEVICE_METAVAR,
    SEGMENT_STYLES,
    ChatTemplateOption,
    Dtype,
    OnError,
    ShardBy,
    TemplateKwargsOption,
    _check_on_error,
    _model_dir,
    _template_overrides,
    check_writable,
    err,
    out,
    say,
    shard_options,
)


def sessions(
    files: Annotated[list[Path], typer.Argument(metavar="FILES", help="Session JSONL files (.gz too), directories of them, or - for standard input.")],
    model: Annotated[Optional[Path], typer.Option("--model", help="Checkpoint directory or cached Hugging Face id whose tokenizer and chat template render the sessions (default: the bundled model).")] = None,
    show: Annotated[Optional[str], typer.Option("--show", help="Render one session, scored spans coloured by segment.")] = None,
    on_error: Annotated[OnError, typer.Option("--on-error", help="fail: stop at the first bad session; skip: warn, count it and go on.")] = "fail",
    chat_template: ChatTemplateOption = None,
    template_kwargs: TemplateKwargsOption = None,
) -> None:
    """What a replay would score: sessions, turns, requests, prompt and scored tokens per segment."""
    from rich.measure import Measurement
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ..checkpoint import read_checkpoint
    from ..rendering import SEGMENTS, Renderer, survey
    from ..sessions import check_inputs

    _check_on_error(on_error)
    check_inputs(files)
    overrides = _template_overrides(chat_template, template_kwargs)
    model_dir = _model_dir(model)
    renderer = Renderer.from_model_dir(model_dir, vocab_size=read_checkpoint(model_dir).geometry.vocab_size, overrides=overrides)
    if show is not None:
        _show_session(files, renderer, show, on_error)
        return
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                  transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task("reading sessions", total=None)
        seen = [0]

        def tick(_item):
            seen[0] += 1
            if seen[0] % 100 == 0:
                progress.update(task, description=plural(seen[0], "session"))

        per_file, total, skipped = survey(files, renderer, on_error=on_error, on_session=tick)
    rows = list(per_file.items()) + ([("total", total)] if len(per_file) > 1 else [])
    columns = ("sessions", "skipped", "turns", "requests", "prompt", *SEGMENTS, "scored")
    cells = [[literal(Path(name).name) if name != "total" else "total", f"{c.sessions:,}", f"{c.skipped:,}", f"{c.assistant_turns:,}",
              f"{c.requests:,}", f"{c.prompt_tokens:,}", *[f"{c.scored[s]:,}" for s in SEGMENTS], f"{c.scored_tokens:,}"]
             for name, c in rows]
    title = "sessions as the replay will score them"
    caption = "turns: assistant turns · prompt: tokens replayed but not scored · then scored tokens per segment"
    t = Table(title=title, caption=caption)
    t.add_column("file", overflow="fold", min_width=12)
    for c in columns:
        t.add_column(c, justify="right", no_wrap=True)
    for r in cells:
        t.add_row(*r)
    if Measurement.get(out, out.options.update_width(10_000), t).maximum > out.width:  # a narrow terminal: a file per column instead, nothing truncated
        t = Table(title=title, caption=caption)
        t.add_column("")
        for r in cells:
            t.add_column(r[0], justify="right", overflow="fold")
        for i, c in enumerate(columns, start=1):
            t.add_row(c, *[r[i] for r in cells])
    out.print(t)
    for s in skipped[:20]:
        say(err, f"skipped: {s.message}")
    if len(skipped) > 20:
        say(err, f"... and {len(skipped) - 20} more skipped")


def _show_session(files, renderer, session_id: str, on_error: str) -> None:
    from rich.text import Text

    from ..rendering import SEGMENTS
    from ..sessions import Skipped, read_sessions

    for item in read_sessions(files, on_error=on_error):
        if isinstance(item, Skipped) or item.id != session_id:
            continue
        rendered = renderer.render(item)
        for req in rendered.requests:
            out.rule(literal(f"session {item.id} · request {req.index} · {plural(len(req.input_ids), 'token')} · "
                             f"{plural(len(req.spans), 'scored turn')}"))
            text = Text()
            style_of = ["dim"] * len(req.input_ids)
            for sp in req.spans:
                for k in range(sp.start, sp.end + 1):
                    style_of[k] = SEGMENT_STYLES[SEGMENTS[sp.segments[k - sp.start]]]
            k = 0
            while k < len(req.input_ids):  # decode runs of one style together (multi-byte characters stay whole)
                j = k
                while j < len(req.input_ids) and style_of[j] == style_of[k]:
                    j += 1
                text.append(visible(renderer.tokenizer.decode(req.input_ids[k:j]), newlines=True), style=style_of[k])
                k = j
            out.print(text, soft_wrap=True)
        legend = Text("legend: ")
        for seg, style in SEGMENT_STYLES.items():
            legend.append(f" {seg} ", style=style)
        legend.append(" prompt (not scored)", style="dim")
        out.print(legend)
        return
    raise OptionError(f"--show {session_id}: no session with that id in {', '.join(map(str, files))}")


class _GenerationProgress:
    """Draws turns, tokens, tokens/s and ETA on stderr while generate runs (generation.Observer)."""

    def __init__(self, progress, every_s: float = 0.0):
        self.progress = progress
        self.task = None
        self.tokens = 0
        self.started = None
        self.total = 0
        self.done = 0
        self.every_s = every_s  # without a terminal: a plain line on stderr every every_s seconds (0: none)
        self.last_line = None

    def start(self, turns: int) -> None:
        import time

        self.started = self.last_line = time.time()
        self.total = turns
        self.task = self.progress.add_task("generating", total=turns, tokens="0 tokens", rate="")

    def turns(self, turns: int, tokens: int) -> None:
        import time

        from ..progress import clock
        from ..wording import plural

        self.tokens += tokens
        self.done += turns
        now = time.time()
        elapsed = max(now - self.started, 1e-9)
        self.progress.update(self.task, advance=turns, tokens=f"{self.tokens:,} tokens", rate=f"{self.tokens / elapsed:,.0f} tok/s")
        if self.every_s > 0 and now - self.last_line >= self.every_s:  # a CI log: the bar is not drawn there
            self.last_line = now
            left = (self.total - self.done) * elapsed / self.done if self.done else None
            say(self.progress.console, f"generate: {self.done:,}/{plural(self.total, 'turn')} · {self.tokens:,} tokens · "
                                       f"{self.tokens / elapsed:,.0f} tok/s · ETA {clock(left)}")

    def warn(self, message: str) -> None:
        say(self.progress.console, f"skipped: {message}")

    def note(self, message: str) -> None:
        say(self.progress.console, f"note: {message}")


def generate(
    files: Annotated[list[Path], typer.Argument(metavar="SESSIONS", help="Session JSONL files (.gz too), directories of them, or - for standard input.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Token-level JSONL to write, one record per session (replaced atomically; <OUT>.partial while it runs).")],
    model: Annotated[Optional[Path], typer.Option("--model", help="Checkpoint directory, or a Hugging Face id (ORG/NAME[@REVISION]) in the local cache (default: the bundled model).")] = None,
    sampling: Annotated[str, typer.Option("--sampling", help="greedy, generation_config (the checkpoint's sampler, vLLM's default), a built-in profile (thinking_general, thinking_coding, instruct_general, instruct_reasoning) or NAME=T,TOP_P,TOP_K[,PRESENCE[,FREQUENCY[,REPETITION[,MIN_P]]]].")] = "generation_config",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Stop a turn after this many tokens if it has not ended.")] = 1024,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sampler; each turn draws from its own generator, seeded from this and the turn.")] = 0,
    speculative: Annotated[Optional[int], typer.Option("--speculative", help="Generate with the MTP head drafting K tokens and the target verifying them (one turn at a time); the steps' accepted lengths go into meta.speculative.")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Turns generated together (left-padded, with the model's cache).")] = 8,
    chunk_size: Annotated[int, typer.Option("--chunk-size", help="Prefill tokens per forward (shared by the batch's rows).")] = 2048,
    device: Annotated[str, typer.Option("--device", metavar=DEVICE_METAVAR, help="Where the target runs (auto: cuda if available).")] = "auto",
    dtype: Annotated[Dtype, typer.Option("--dtype", help="auto: bfloat16 on CUDA, float32 on CPU.")] = "auto",
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted output (or add sessions to a finished one) without regenerating its sessions.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a finished output (it stays as it was until the new one is whole).")] = False,
    on_error: Annotated[OnError, typer.Option("--on-error", help="fail: a bad session stops the run; skip: it is reported and left out.")] = "fail",
    chat_template: ChatTemplateOption = None,
    template_kwargs: TemplateKwargsOption = None,
    progress_every: Annotated[float, typer.Option("--progress-every", metavar="SECONDS", help="Without a terminal (a CI log): print the progress line to stderr every SECONDS (0: never).")] = 30.0,
    shard: Annotated[Optional[str], typer.Option("--shard", metavar="I/N", help="Generate shard I of N (0-based): the sessions whose id hashes to I, as replay --shard; the shards' outputs together are the replay's input (docs/scale.md).")] = None,
    shard_by: Annotated[ShardBy, typer.Option("--shard-by", help="id: a session's shard is a hash of its id; tokens: shards balanced by tokens, longest session first.")] = "id",
) -> None:
    """The target's own completion of every assistant turn, in the recorded contexts: token-level records for replay."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from ..generation import GenerateOptions, generate as run_generate

    _check_on_error(on_error)
    shard_spec = shard_options(shard, shard_by, "generate")
    if progress_every < 0:
        raise OptionError(f"--progress-every {progress_every:g}: expected seconds >= 0 (0: no progress lines)")
    overrides = _template_overrides(chat_template, template_kwargs)
    model_dir = _model_dir(model)
    check_writable(output, "--output", inputs=[*files, chat_template], kept=[model_dir])
    opts = GenerateOptions(sampling=sampling, max_new_tokens=max_new_tokens, seed=seed, speculative=speculative,
                           batch_size=batch_size, chunk_size=chunk_size, device=device, dtype=dtype, on_error=on_error,
                           resume=resume, overwrite=overwrite, template=overrides, shard=shard_spec)
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("turns"),
                      TextColumn("{task.fields[tokens]}", markup=False), TextColumn("{task.fields[rate]}", markup=False),
                      TimeRemainingColumn(), console=err, transient=True, disable=not err.is_terminal) as progress:
            summary = run_generate(files, model_dir, output, opts, observer=_GenerationProgress(
                progress, every_s=0.0 if err.is_terminal else progress_every))
    except KeyboardInterrupt:  # every session written so far is whole in the partial file
        partial = output.with_name(output.name + ".partial")
        if partial.exists():
            say(err, f"interrupted: the sessions written so far are kept in {partial}; continue with the same command and --resume")
        else:
            say(err, "interrupted before any session was written; nothing is kept")
        raise typer.Exit(130)
    p = summary.profile
    say(out, f"generated {plural(summary.turns, 'turn')} ({plural(summary.tokens, 'token')}, {summary.tokens_per_s:,.1f} tok/s; "
             f"{plural(summary.prompt_tokens, 'prompt token')} prefilled) with "
             f"{p.name} (T {p.temperature:g}, top-p {p.top_p:g}, top-k {p.top_k}, min-p {p.min_p:g}, presence "
             f"{p.presence_penalty:g}, frequency {p.frequency_penalty:g}, repetition {p.repetition_penalty:g}), seed {seed}"
             + (f", --speculative {speculative}" if speculative else ""))
    kept = f" ({summary.kept} kept from the resumed output)" if summary.kept else ""
    dropped = f"; {plural(summary.dropped, 'one-token turn')} left out" if summary.dropped else ""
    skipped = f"; {plural(len(summary.skipped), 'session')} skipped" if summary.skipped else ""
    say(out, f"wrote {plural(summary.sessions + summary.kept, 'session')} to {output}{kept}{dropped}{skipped}")
    say(out, f"next: mtp-observe replay {output}" + (f" --model {model}" if model is not None else "")
             + (f" --k {speculative}" if speculative and speculative > 4 else ""))


def import_(
    fmt: Annotated[str, typer.Argument(metavar="FORMAT", help="tau-bench, tau2-bench, mini-swe-agent, claude-code, anthropic, openai-chat, "
                                                            "openai-responses, openai-batch, otel-genai, litellm, vllm-log, openhands, "
                                                            "or auto (detect each file's format).")],
    files: Annotated[list[Path], typer.Argument(metavar="FILES", help="Log files in that format (.gz too), directories of them, or - for standard input.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Canonical session JSONL to write (replaced atomically).")],
    tools: Annotated[Optional[Path], typer.Option("--tools", help="OpenAI tool schemas (JSON list) for logs that lack them (used only where the log holds none).")] = None,
    system_template: Annotated[Optional[Path], typer.Option("--system-template", help="tau2-bench agent system prompt template with {domain_policy} (default: agent_system_prompt_template.txt beside the file).")] = None,
    on_error: Annotated[OnError, typer.Option("--on-error", help="fail: stop at the first bad record and write nothing; skip: warn, count it and go on.")] = "fail",
) -> None:
    """Convert real agent logs to canonical session JSONL (one session per line), validated."""
    from ..importers import FORMATS, OPTIONS_READ, Options, import_files

    if fmt != "auto" and fmt not in FORMATS:
        raise OptionError(f"FORMAT {fmt}: expected one of {', '.join(FORMATS)} or auto")
    _check_on_error(on_error)
    check_writable(output, "--output", inputs=[*files, tools, system_template])
    for option, value in (("tools", tools), ("system_template", system_template)):
        readers = OPTIONS_READ[option]
        if value is not None and fmt != "auto" and fmt not in readers:
            raise OptionError(f"--{option.replace('_', '-')} applies to {', '.join(readers)}; name that FORMAT instead of {fmt}")
    warnings: list[str] = []  # said once the import succeeds: a refusal's stderr is its one line
    counts = import_files(fmt, files, output, Options(tools=tools, system_template=system_template), on_error=on_error,
                          warn=warnings.append)
    for message in warnings[:20]:
        say(err, f"skipped: {message}")
    if len(warnings) > 20:
        say(err, f"... and {len(warnings) - 20} more skipped")
    for c in counts:
        notes = [c.format] + ([c.note] if c.note else []) + ([f"{len(c.skipped)} skipped"] if c.skipped else [])
        notes += [f"{n} {kind.replace('_', ' ')} dropped" for kind, n in sorted(c.dropped.items())]
        say(out, f"{c.path}: {plural(c.sessions, 'session')} ({', '.join(notes)})")
    total = sum(c.sessions for c in counts)
    say(out, f"wrote {plural(total, 'session')} to {output}")
