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
    show: Annotated[Optional[str], typer.Option("--show", help="Render one session, scored spans coloured by segment, and where each turn starts and ends.")] = None,
    on_error: Annotated[OnError, typer.Option("--on-error", help="fail: stop at the first bad session; skip: warn, count it and go on.")] = "fail",
    chat_template: ChatTemplateOption = None,
    template_kwargs: TemplateKwargsOption = None,
    estimate: Annotated[bool, typer.Option("--estimate/--no-estimate", help="Estimate the time of a replay and of a generate of these sessions from a short calibration on the model (which loads its weights); --no-estimate counts the work alone.")] = True,
    device: Annotated[str, typer.Option("--device", metavar=DEVICE_METAVAR, help="Where the estimate's calibration runs (auto: cuda if available): the device the replay will run on.")] = "auto",
) -> None:
    """What a replay would score: sessions, turns, requests, prompt and scored tokens per segment; the work and time of a replay and a generate."""
    from rich.measure import Measurement
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ..model.checkpoint import read_checkpoint
    from ..run.estimate import ReplayWork, estimate_line, replay_work, survey_estimates, turn_shapes
    from ..sessions.reading import check_inputs
    from ..sessions.rendering import SEGMENTS, RenderedSession, Renderer, survey

    _check_on_error(on_error)
    check_inputs(files)
    overrides = _template_overrides(chat_template, template_kwargs)
    model_dir = _model_dir(model)
    geometry = read_checkpoint(model_dir).geometry
    renderer = Renderer.from_model_dir(model_dir, vocab_size=geometry.vocab_size, overrides=overrides)
    renderer.turn_errors = on_error  # skip: a turn that cannot be reconstructed is left out (and said), not its session
    if show is not None:
        _show_session(files, renderer, show, on_error)
        return
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                  transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task("reading sessions", total=None)
        seen = [0]
        work, turns = [ReplayWork()], []  # what a replay and a generate of them compute (estimate.py)

        def tick(item):
            seen[0] += 1
            if seen[0] % 100 == 0:
                progress.update(task, description=plural(seen[0], "session"))
            if isinstance(item, RenderedSession):
                work[0] += replay_work(item, 4, 2048, geometry.num_heads)
                turns.append(turn_shapes(item))

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
    if total.turns_skipped:
        say(err, f"{plural(total.turns_skipped, 'assistant turn')} left out (their sessions kept): --on-error skip")
    if total.switches:  # which thinking switch each session rendered with, and where it came from
        rendered_with = "; ".join(f"{k}: {plural(n, 'session')}" for k, n in sorted(total.switches.items()))
        say(out, f"thinking switches: {rendered_with}; other sessions: the template's default")
    replay_estimate, generate_estimate = survey_estimates(model_dir, work[0], turns, device, estimate, template=overrides)
    import textwrap

    width = max(out.width, 40)  # the console's width, which the table above was drawn to: nothing cut
    for line in (estimate_line(replay_estimate, "replay (--k 4)"), estimate_line(generate_estimate, "generate (--batch-size 8)")):
        for part in textwrap.wrap(line, width=width, subsequent_indent="  ", break_on_hyphens=False):
            say(out, part)


SHOW_TOKENS = 4  # tokens shown at each end of a boundary


def turn_bounds(tokenizer, ids, span, n: int = SHOW_TOKENS) -> list[str]:
    """Lines saying where a scored turn starts and ends: the prompt's last n tokens, the scored span's first n and
    last n, each token decoded alone and quoted (control characters escaped by literal()). Worked example (GLM-4.5
    shape): turn 2 · prompt ends "42" "?" "<|assistant|>" | scored 61 tokens: starts "\\n" "<think>" "The" ...
    ends ... "</tool_call>" "<|observation|>"."""
    def show(tokens):
        return " ".join(json_quote(tokenizer.decode([t])) for t in tokens)

    first = ids[span.start: min(span.start + n, span.end + 1)]
    last = ids[max(span.end + 1 - n, span.start + len(first)): span.end + 1]
    scored = span.end - span.start + 1
    return [f"turn {span.turn} · prompt ends {show(ids[max(0, span.start - n): span.start])}",
            f"  scored {plural(scored, 'token')}: starts {show(first)}" + (f" ... ends {show(last)}" if last else "")]


def json_quote(text: str) -> str:
    import json

    return json.dumps(text, ensure_ascii=False)


def _show_session(files, renderer, session_id: str, on_error: str) -> None:
    from rich.text import Text

    from ..sessions.reading import Skipped, read_sessions
    from ..sessions.rendering import SEGMENTS

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
            for sp in req.spans:  # where each turn starts and ends, token by token
                for line in turn_bounds(renderer.tokenizer, req.input_ids, sp):
                    out.print(literal(line))
        for turn, message in rendered.skipped_turns:
            say(err, f"turn {turn} left out: {message}")
        legend = Text("legend: ")
        for seg, style in SEGMENT_STYLES.items():
            legend.append(f" {seg} ", style=style)
        legend.append(" prompt (not scored)", style="dim")
        out.print(legend)
        return
    raise OptionError(f"--show {session_id}: no session with that id in {', '.join(map(str, files))}")


def generate(
    files: Annotated[list[Path], typer.Argument(metavar="SESSIONS", help="Session JSONL files (.gz too), directories of them, or - for standard input.")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Token-level JSONL to write, one record per session (replaced atomically; <OUT>.partial while it runs).")] = None,
    model: Annotated[Optional[Path], typer.Option("--model", help="Checkpoint directory, or a Hugging Face id (ORG/NAME[@REVISION]) in the local cache (default: the bundled model).")] = None,
    sampling: Annotated[str, typer.Option("--sampling", help="greedy, generation_config (the checkpoint's sampler, vLLM's default), a built-in profile (thinking_general, thinking_coding, instruct_general, instruct_reasoning) or NAME=T,TOP_P,TOP_K[,PRESENCE[,FREQUENCY[,REPETITION[,MIN_P]]]].")] = "generation_config",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Stop a turn after this many tokens if it has not ended.")] = 1024,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed of the sampler; each turn draws from its own generator, seeded from this and the turn (default 0; --engine vllm: each request's seed, and without it the server's own generator).")] = None,
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
    max_sessions: Annotated[Optional[int], typer.Option("--max-sessions", help="Generate for at most N sessions (the first N of the input, as replay counts them).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the estimate of the work (prompt tokens, tokens to generate, a time range from a short calibration on the model) and exit, writing nothing.")] = False,
    engine: Annotated[str, typer.Option("--engine", help="Who samples the completions: transformers (here, the default) or vllm (a running vLLM server, --engine-url).")] = "transformers",
    engine_url: Annotated[Optional[str], typer.Option("--engine-url", metavar="URL", help="--engine vllm: the server's address (its OpenAI-compatible API, e.g. http://127.0.0.1:8000); --batch-size requests are kept in flight.")] = None,
) -> None:
    """The target's own completion of every assistant turn, in the recorded contexts: token-level records for replay."""
    from ..run.estimate import estimate_line
    from ..run.generation import GenerateOptions, generate as run_generate, generate_estimate
    from ..run.progress import GenerationCounter, ProgressDisplay, generation_lines

    _check_on_error(on_error)
    shard_spec = shard_options(shard, shard_by, "generate")
    if progress_every < 0:
        raise OptionError(f"--progress-every {progress_every:g}: expected seconds >= 0 (0: no progress lines)")
    if output is None and not dry_run:
        raise OptionError("generate writes its completions to -o OWN.jsonl; name that file (or pass --dry-run for the estimate alone)")
    overrides = _template_overrides(chat_template, template_kwargs)
    model_dir = _model_dir(model)
    if not dry_run:
        check_writable(output, "--output", inputs=[*files, chat_template], kept=[model_dir])
    if seed is None and engine != "vllm":
        seed = 0
    opts = GenerateOptions(sampling=sampling, max_new_tokens=max_new_tokens, seed=seed, speculative=speculative,
                           batch_size=batch_size, chunk_size=chunk_size, device=device, dtype=dtype, on_error=on_error,
                           resume=resume, overwrite=overwrite, template=overrides, shard=shard_spec,
                           max_sessions=max_sessions, engine=engine, engine_url=engine_url)
    if dry_run:
        say(out, estimate_line(generate_estimate(files, model_dir, opts)))
        return
    try:
        # A live line on a terminal, cleared when it stops; a plain line every --progress-every seconds without one.
        with ProgressDisplay(err, live=err.is_terminal, every_s=progress_every, say=say, counter=GenerationCounter(),
                             lines=generation_lines, on_estimate=lambda line: say(out, line)) as progress:
            summary = run_generate(files, model_dir, output, opts, observer=progress)
    except KeyboardInterrupt:  # every session written so far is whole in the partial file
        partial = output.with_name(output.name + ".partial")
        if partial.exists():
            say(err, f"interrupted: the sessions written so far are kept in {partial}; continue with the same command and --resume")
        else:
            say(err, "interrupted before any session was written; nothing is kept")
        raise typer.Exit(130)
    if not summary.written:  # a shard that owns no session (the note said so)
        return
    p = summary.profile
    say(out, f"generated {plural(summary.turns, 'turn')} ({plural(summary.tokens, 'token')}, {summary.tokens_per_s:,.1f} tok/s; "
             f"{plural(summary.prompt_tokens, 'prompt token')} prefilled) with "
             f"{p.name} (T {p.temperature:g}, top-p {p.top_p:g}, top-k {p.top_k}, min-p {p.min_p:g}, presence "
             f"{p.presence_penalty:g}, frequency {p.frequency_penalty:g}, repetition {p.repetition_penalty:g}), "
             + (f"seed {seed}" if seed is not None else "the server's own seed")
             + (f", by vLLM at {engine_url}" if engine == "vllm" else "")
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
    on_error: Annotated[Optional[OnError], typer.Option("--on-error", help="fail: stop at the first bad record and write nothing; skip: warn, count it and go on (default: fail, but under auto a file found in a directory that cannot be read as a log is skipped and named; --on-error fail stops there too).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing --output (without it, an existing file is refused).")] = False,
) -> None:
    """Convert real agent logs to canonical session JSONL (one session per line), validated."""
    from ..sessions.importers import FORMATS, OPTIONS_READ, Options, import_files

    if fmt != "auto" and fmt not in FORMATS:
        raise OptionError(f"FORMAT {fmt}: expected one of {', '.join(FORMATS)} or auto")
    strict, on_error = on_error == "fail", on_error or "fail"
    _check_on_error(on_error)
    check_writable(output, "--output", inputs=[*files, tools, system_template])
    if not overwrite and output.exists():
        raise OptionError(f"--output {output}: exists; pass --overwrite to replace it, or choose another path")
    for option, value in (("tools", tools), ("system_template", system_template)):
        readers = OPTIONS_READ[option]
        if value is not None and fmt != "auto" and fmt not in readers:
            raise OptionError(f"--{option.replace('_', '-')} applies to {', '.join(readers)}; name that FORMAT instead of {fmt}")
    warnings: list[str] = []  # said once the import succeeds: a refusal's stderr is its one line
    counts = import_files(fmt, files, output, Options(tools=tools, system_template=system_template), on_error=on_error,
                          warn=warnings.append, strict=strict)
    for message in warnings[:20]:
        say(err, f"skipped: {message}")
    if len(warnings) > 20:
        say(err, f"... and {len(warnings) - 20} more skipped")
    for c in counts:
        notes = [c.format] + ([c.note] if c.note else []) + ([f"{len(c.skipped)} skipped"] if c.skipped else [])
        notes += [f"{n} {kind.replace('_', ' ')} dropped" for kind, n in sorted(c.dropped.items())]
        say(out, f"{c.path}: {plural(c.sessions, 'session')} ({', '.join(notes)})")
    total = sum(c.sessions for c in counts)
    unread = sum(c.note.endswith(", skipped") for c in counts)  # files found in a directory that are no readable log
    say(out, f"wrote {plural(total, 'session')} to {output}" + (f"; {plural(unread, 'file')} skipped" if unread else ""))
