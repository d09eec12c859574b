"""The command line: each command checks its options, calls the library once, and prints.

Errors a user can cause (`errors.UserError`) become one line on stderr and exit code 2;
the traceback only with MTP_OBSERVE_DEBUG=1. Usage errors (unknown option, missing
argument) are one line too, and on failure that line is all stderr holds: progress bars are
transient (drawn only on a terminal, cleared when they stop) and library logging and warnings
(transformers' kernel fallbacks on CPU, torch's UserWarnings) are silenced unless
MTP_OBSERVE_DEBUG=1.

Printing: both consoles interpret no markup and no emoji codes, and every user-controlled
string (file names, session ids, tensor names, decoded text, messages) goes through
`literal.literal`/`literal.visible`, which show control characters and ANSI escapes as escapes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from rich.console import Console
from rich.table import Table

from .errors import OptionError, UserError
from .literal import literal, visible
from .wording import plural

app = typer.Typer(
    name="mtp-observe",
    help="Measure how often a Qwen3.5 checkpoint's MTP draft head would be accepted on recorded sessions.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
# Piped without COLUMNS, rich would assume 80 columns and fold or truncate the tables; a log is wider.
out = Console(highlight=False, markup=False, emoji=False,
              width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160)
err = Console(stderr=True, highlight=False, markup=False, emoji=False)


def say(console: Console, text, style=None) -> None:
    """One line of (possibly user-controlled) text, printed literally and never wrapped."""
    console.print(literal(text, style), soft_wrap=True)


def _print_version(value: bool) -> None:
    if value:
        from . import __version__

        print(f"mtp-observe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """mtp-observe: MTP draft-head acceptance on recorded sessions, as tables and a go/no-go gate."""


# Fixed sets of values are Literal types: help lists them (<a|b|c>), the shell completes them, and a value
# outside them is refused before the command runs (main words the refusal: `--format x: expected one of ...`).
OnError = Literal["fail", "skip"]
ReportFormat = Literal["table", "markdown", "json"]
Dtype = Literal["auto", "float32", "bfloat16"]
DEVICE_METAVAR = "<auto|cpu|cuda|cuda:N>"  # cuda:N is open-ended, so not a Choice; pipeline.resolve_device checks it


def human_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


MODEL_HELP = "Checkpoint directory, or a Hugging Face id (ORG/NAME[@REVISION]) already in the local cache (never downloaded)."


@app.command()
def inspect(
    model: Annotated[Path, typer.Argument(metavar="MODEL", help=MODEL_HELP)],
    as_json: Annotated[bool, typer.Option("--json", help="Emit the numbers as JSON.")] = False,
) -> None:
    """What the head is: tensors, shapes, bytes, borrowed weights, draft-cost roofline (headers only)."""
    from .checkpoint import read_checkpoint
    from .hub import resolve_model
    from .inventory import PRECISIONS, inventory_json, take_inventory

    inv = take_inventory(read_checkpoint(resolve_model(model, "MODEL")))
    if as_json:
        print(json.dumps(inventory_json(inv), indent=2))
        return
    heading = literal(inv.model, "bold")
    heading.append(visible(f"  model_type={inv.model_type}  layout={inv.layout}"))
    out.print(heading, soft_wrap=True)
    cfg = Table(title="config", show_header=False)
    for k, v in inv.config.items():
        cfg.add_row(literal(k), literal(v))
    out.print(cfg)
    t = Table(title=f"MTP head: {plural(len(inv.head), 'tensor')}")
    for c in ("tensor", "shape", "dtype", "bytes"):
        t.add_column(c, justify="right" if c == "bytes" else "left")
    for e in inv.head:
        t.add_row(literal(e.name), str(list(e.shape)), literal(e.dtype), f"{e.nbytes:,}")
    t.add_row(literal("total", "bold"), f"{sum(e.numel for e in inv.head):,} params", "", literal(f"{inv.head_bytes():,}", "bold"))
    out.print(t)
    b = Table(title="borrowed from the target (read by every draft step)")
    for c in ("tensor", "role", "shape", "dtype", "bytes"):
        b.add_column(c)
    roles = [(inv.embedding, "embedding + lm_head (tied)")] if inv.tied else [(inv.embedding, "embedding"), (inv.lm_head, "lm_head")]
    for e, role in roles:
        b.add_row(literal(e.name), role, str(list(e.shape)), literal(e.dtype), f"{e.nbytes:,}")
    out.print(b)
    data = inventory_json(inv)
    storage = data["head"]["storage"]
    out.print(f"head storage: {storage['precision']}; numerics: {inv.numerics}", markup=False, soft_wrap=True)
    if storage["fp8_tensors"]:
        q = Table(title="head quantisation coverage")
        for c in ("tensors", "count", "stored as"):
            q.add_column(c)
        for kind, groups in (("FP8 e4m3", storage["fp8_tensors"]), (f"scales ({storage['scale_dtype']})", storage["scale_tensors"]),
                             ("kept float", storage["float_tensors"])):
            for grp in groups:
                q.add_row(grp["name"], str(grp["count"]), kind)
        out.print(q)
    if data["experts"] is not None:
        x = data["experts"]
        e = Table(title=f"experts: {x['count']} routed ({x['routed_per_token']} per token) + {x['shared_per_token']} shared, "
                        f"layout {x['layout']}, norm_topk_prob {x['norm_topk_prob']}")
        for c in ("part", "MoE layers", "bytes per expert", "routed bytes", "active routed bytes", "shared bytes", "active params"):
            e.add_column(c, justify="right")
        for part in ("target", "head"):
            y = x[part]
            e.add_row(part, str(y["moe_layers"]), human_bytes(y["bytes_per_expert"]), human_bytes(y["routed_bytes"]),
                      human_bytes(y["active_routed_bytes"]), human_bytes(y["shared_bytes"]), f"{y['active_params']:,}")
        out.print(e)
    step = " (batch-1 step: routed experts at top-k / E)" if data["experts"] is not None else ""
    r = Table(title=f"roofline draft cost c = (head + lm_head bytes) / target bytes{step}")
    for c in ("precision", "head", "lm_head", "draft step", "target", "c"):
        r.add_column(c, justify="right")
    for p in ["stored", *PRECISIONS]:
        r.add_row(p, human_bytes(inv.head_step_bytes(p)), human_bytes(inv.lm_head_bytes(p)),
                  human_bytes(inv.head_step_bytes(p) + inv.lm_head_bytes(p)), human_bytes(inv.target_step_bytes(p)),
                  f"{inv.draft_cost(p):.4f}")
    out.print(r)


SEGMENT_STYLES = {"reasoning": "magenta", "text": "green", "tool_call": "cyan", "end": "bold red"}


def _model_dir(model: Optional[Path]) -> Path:
    """--model (a directory, or a hub id in the local cache), or the bundled model, said on stdout (stderr is
    kept for the error line of a failure)."""
    from .hub import resolve_model
    from .pipeline import default_model_dir

    if model is not None:
        return resolve_model(model, "--model")
    path = default_model_dir()
    say(out, f"using the bundled default model ({path}); pass --model DIR for your own checkpoint")
    return path


# Rendering overrides, shared by every command that renders sessions (sessions, replay, generate).
ChatTemplateOption = Annotated[Optional[Path], typer.Option(
    "--chat-template", help="Render with this Jinja chat template instead of the checkpoint's (what the server used, e.g. vLLM's --chat-template).")]
TemplateKwargsOption = Annotated[Optional[str], typer.Option(
    "--template-kwargs", help='Template variables as a JSON object, e.g. \'{"enable_thinking": false}\' (vLLM\'s chat_template_kwargs).')]


def _template_overrides(chat_template: Optional[Path], template_kwargs: Optional[str]):
    """--chat-template and --template-kwargs, checked once (rendering.template_overrides)."""
    from .rendering import template_overrides

    return template_overrides(chat_template, template_kwargs)


def _check_on_error(on_error: str) -> None:
    if on_error not in ("fail", "skip"):
        raise OptionError(f"--on-error {on_error}: expected fail or skip")


@app.command()
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

    from .checkpoint import read_checkpoint
    from .rendering import SEGMENTS, Renderer, survey
    from .sessions import check_inputs

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

    from .rendering import SEGMENTS
    from .sessions import Skipped, read_sessions

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


def _parse_sampling(specs: list[str], recorded_with: Optional[str] = None):
    """--sampling specs and --recorded-with -> (profiles, the declared profile's name or None).

    The profiles are the built-in ones and the checkpoint's generation_config (added by the replay),
    replaced or extended by --sampling; --recorded-with NAME=... adds (or replaces) one more."""
    from .target import profile_from_spec

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


def _parse_ngram(text: Optional[str]):
    """--ngram MIN,MAX (or N for both) -> drafters.ngram.NgramConfig, vLLM's resolution of the two bounds."""
    from .drafters.ngram import ngram_config

    if text is None:
        return ngram_config()
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (1, 2) or not all(p.isdigit() for p in parts):
        raise OptionError(f"--ngram {text}: expected MIN,MAX (vLLM's prompt_lookup_min, prompt_lookup_max), e.g. 3,5")
    lo, hi = int(parts[0]), int(parts[-1])
    return ngram_config(lo, hi)


def _with_defaults(extra, model_dir: Path) -> tuple:
    """The default profiles, each replaced by an --sampling profile of the same name, then the new ones."""
    from .pipeline import default_profiles

    by_name = {p.name: p for p in default_profiles(model_dir)}
    by_name.update({p.name: p for p in extra})
    return tuple(by_name.values())


@app.command()
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
    chat_template: ChatTemplateOption = None,
    template_kwargs: TemplateKwargsOption = None,
    drafters: Annotated[str, typer.Option("--drafters", help="Drafters to run side by side at every anchor: mtp (the head), ngram (vLLM's prompt lookup), suffix (suffix decoding), hybrid (Arctic's: suffix when its score >= K, else mtp), hybrid_longer (the longer of suffix's and mtp's). Model-free only (ngram, suffix): no weights are loaded.")] = "mtp",
    ngram: Annotated[Optional[str], typer.Option("--ngram", help="MIN,MAX: vLLM's prompt_lookup_min, prompt_lookup_max (default 5,5; one number sets both).")] = None,
    suffix_max_tree_depth: Annotated[int, typer.Option("--suffix-max-tree-depth", help="vLLM's suffix_decoding_max_tree_depth.")] = 24,
    suffix_max_cached_requests: Annotated[int, typer.Option("--suffix-max-cached-requests", help="vLLM's suffix_decoding_max_cached_requests (outputs the global tree keeps; 0: none).")] = 10000,
    suffix_max_spec_factor: Annotated[float, typer.Option("--suffix-max-spec-factor", help="vLLM's suffix_decoding_max_spec_factor (draft at most factor x match length + offset).")] = 1.0,
    suffix_max_spec_offset: Annotated[float, typer.Option("--suffix-max-spec-offset", help="Arctic's max_spec_offset (vLLM leaves it 0).")] = 0.0,
    suffix_min_token_prob: Annotated[float, typer.Option("--suffix-min-token-prob", help="vLLM's suffix_decoding_min_token_prob.")] = 0.1,
    part_sessions: Annotated[int, typer.Option("--part-sessions", metavar="N", help="Write the run's Parquet parts N sessions at a time at most (fewer when a part reaches 2M rows or a minute's work); 1: one part per session.")] = 256,
    progress_every: Annotated[float, typer.Option("--progress-every", metavar="SECONDS", help="Without a terminal (a CI log): print the progress line to stderr every SECONDS (0: never).")] = 30.0,
) -> None:
    """Replay sessions through the target with the MTP head (and other drafters) alongside; write the run directory."""
    from .drafters.roster import NEEDS_MTP, parse_drafters
    from .drafters.suffix import SuffixConfig
    from .manifest import default_run_dir
    from .pipeline import ReplayOptions, replay as run_replay
    from .progress import ProgressDisplay

    _check_on_error(on_error)
    if progress_every < 0:
        raise OptionError(f"--progress-every {progress_every:g}: expected seconds >= 0 (0: no progress lines)")
    names = parse_drafters(drafters)
    ngram_config = _parse_ngram(ngram)
    suffix_config = SuffixConfig(max_tree_depth=suffix_max_tree_depth, max_cached_requests=suffix_max_cached_requests,
                                 max_spec_factor=suffix_max_spec_factor, max_spec_offset=suffix_max_spec_offset,
                                 min_token_prob=suffix_min_token_prob)
    model_free = not any(n in NEEDS_MTP for n in names)
    if model_free and (sampling or recorded_with):
        raise OptionError(f"--sampling and --recorded-with score the target's sampler, which a replay of model-free drafters "
                          f"only (--drafters {drafters}) does not run; add mtp to --drafters, or drop them")
    overrides = _template_overrides(chat_template, template_kwargs)
    bundled = model is None
    model_dir = _model_dir(model)
    out_path = out_dir or default_run_dir()
    extra, declared = _parse_sampling(sampling or [], recorded_with)
    opts = ReplayOptions(k=k, chunk_size=chunk_size, device=device, dtype=dtype,
                         profiles=_with_defaults(extra, model_dir) if not model_free else (), recorded_with=declared,
                         on_error=on_error, max_sessions=max_sessions, resume=resume, overwrite=overwrite,
                         device_map=device_map, template=overrides, drafters=names, ngram=ngram_config,
                         suffix=suffix_config, part_sessions=part_sessions)
    rank0 = os.environ.get("RANK", "0") == "0"  # under torchrun only rank 0 draws and summarises
    try:
        # A live line on a terminal, cleared when it stops (a failure leaves its error line alone); a plain
        # line every --progress-every seconds without one.
        with ProgressDisplay(err, live=rank0 and err.is_terminal, every_s=progress_every if rank0 else 0, say=say) as progress:
            run_dir = run_replay(files, model_dir, out_path, opts, bundled=bundled, observer=progress if rank0 else None)
    except KeyboardInterrupt:  # run.json says "failed"; every finished session's part is complete on disk
        if rank0:
            done = _sessions_kept(out_path)
            say(err, f"interrupted: {plural(done, 'finished session')} {'is' if done == 1 else 'are'} kept in {out_path}; "
                     f"continue with the same command and --out {out_path} --resume")
        raise typer.Exit(130)
    if rank0:
        _print_replay_summary(run_dir)


def _sessions_kept(run_dir: Path) -> int:
    """The sessions an interrupted replay left on disk, as its run.json counts them (parts.counts_on_disk)."""
    from .tables import read_manifest

    try:
        return int(read_manifest(run_dir).get("counts", {}).get("sessions_ok", 0))
    except (UserError, ValueError, TypeError):
        return 0


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

        from .progress import clock
        from .wording import plural

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


@app.command()
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
    on_error: Annotated[OnError, typer.Option("--on-error", help="fail: a bad session stops the run; skip: it is reported and left out.")] = "fail",
    chat_template: ChatTemplateOption = None,
    template_kwargs: TemplateKwargsOption = None,
    progress_every: Annotated[float, typer.Option("--progress-every", metavar="SECONDS", help="Without a terminal (a CI log): print the progress line to stderr every SECONDS (0: never).")] = 30.0,
) -> None:
    """The target's own completion of every assistant turn, in the recorded contexts: token-level records for replay."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from .generation import GenerateOptions, generate as run_generate

    _check_on_error(on_error)
    if progress_every < 0:
        raise OptionError(f"--progress-every {progress_every:g}: expected seconds >= 0 (0: no progress lines)")
    overrides = _template_overrides(chat_template, template_kwargs)
    check_writable(output, "--output")
    model_dir = _model_dir(model)
    opts = GenerateOptions(sampling=sampling, max_new_tokens=max_new_tokens, seed=seed, speculative=speculative,
                           batch_size=batch_size, chunk_size=chunk_size, device=device, dtype=dtype, on_error=on_error,
                           resume=resume, template=overrides)
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


def _print_replay_summary(run_dir: Path) -> None:
    """One screen: what was replayed, α_k per depth, τ_sim(K) for each K, the recording sampler, where it went."""
    from .report import drafter_cost, load_run, resolve_cost, run_drafters, summarize
    from .tables import read_manifest

    if len(run_drafters(read_manifest(run_dir))) > 1:
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
    if str(m.get("device", "")).startswith("cuda"):  # transformers' own warning about it is silenced (stderr is ours)
        import importlib.util

        missing = [p for p, module in (("flash-linear-attention", "fla"), ("causal-conv1d", "causal_conv1d"))
                   if importlib.util.find_spec(module) is None]
        if missing:
            say(out, f"note: the target ran transformers' reference linear-attention kernels (correct, slower); "
                     f"pip install {' '.join(missing)} for the fast ones")
    say(out, f"run directory: {run_dir}   next: mtp-observe report {run_dir}")


def _print_drafters_summary(run_dir: Path) -> None:
    """The replay summary of a run of several drafters: τ_sim(K) of each (α_1 in its header), where it went. One
    drafter's rows are read at a time."""
    from .report import load_run, model_free_cost, run_drafters, summarize
    from .tables import read_manifest

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
    say(out, f"run directory: {run_dir}   next: mtp-observe report {run_dir}")


REPORT_FORMATS = ("table", "markdown", "json")


def check_writable(path: Optional[Path], option: str, suffixes: tuple[str, ...] = ()) -> None:
    """Refuse before the work, not after it, an output file of the wrong kind or in a directory that does not
    exist or cannot be written (access(2) says so for a read-only mount or an immutable directory, root too)."""
    if path is None:
        return
    if suffixes and path.suffix.lower() not in suffixes:
        raise OptionError(f"{option} {path}: expected a {' or '.join(suffixes)} file name (this option writes "
                          f"{suffixes[0].lstrip('.').upper()})")
    parent = path.resolve().parent
    if not parent.is_dir():
        raise OptionError(f"{option} {path}: the directory {path.parent} does not exist; create it or choose another path")
    if not os.access(parent, os.W_OK):
        raise OptionError(f"{option} {path}: cannot write in {path.parent} (not writable); choose another path")


def write_output(path: Path, option: str, write) -> None:
    """write(path), with an OS failure (a full disk, a read-only directory) as one line naming the option."""
    try:
        write(path)
    except OSError as e:
        raise OptionError(f"{option} {path}: cannot write ({e.strerror or e}); choose another path") from None
    say(err, f"wrote {path}")


@app.command()
def report(
    run: Annotated[Optional[Path], typer.Argument(metavar="RUN", help="Run directory (default: the newest under reports/).")] = None,
    gate: Annotated[Optional[str], typer.Option(help="Go/no-go gate, METRIC>=X with METRIC speedup, tau_sim or alpha1; "
                                                     "judged on the 95% lower bound at the best K.")] = None,
    recorded_with: Annotated[Optional[str], typer.Option("--recorded-with", help="The profile the sessions were recorded with "
                                                         "(overrides run.json; default: the best-fitting candidate).")] = None,
    min_support: Annotated[float, typer.Option("--min-support", "--min-on-policy", help="A sampler fits the traffic only if at "
                                               "least this share of the recorded tokens is in its support.")] = 0.95,
    fmt: Annotated[Optional[ReportFormat], typer.Option("--format", help="How the report is printed (default: table).")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Write acceptance by depth and speedup vs K to this PNG.")] = None,
    baseline: Annotated[Optional[Path], typer.Option(help="Another run: show the tables as differences from it.")] = None,
    probe: Annotated[Optional[Path], typer.Option(help="probe.json from `mtp-observe probe`: measured c and v(K).")] = None,
    draft_cost: Annotated[Optional[float], typer.Option(help="c = draft step / target decode step (default: roofline).")] = None,
    heatmap: Annotated[Optional[str], typer.Option(help="Show this session's text coloured by accepted length (alone: only that; "
                                                        "with --format/--gate/--plot/--baseline/--probe/--draft-cost: after the report).")] = None,
    html: Annotated[Optional[Path], typer.Option(help="Write the --heatmap session as a standalone HTML page.")] = None,
    replicates: Annotated[int, typer.Option(help="Bootstrap resamples of sessions.")] = 1000,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
    drafter: Annotated[Optional[str], typer.Option("--drafter", help="The drafter the tables, the gate and --baseline judge "
                                                   "(default: mtp when the run has it, else its first); every drafter is ranked.")] = None,
    batch: Annotated[str, typer.Option("--batch", help="Batch size B (or a range LO-HI) where the gate is judged: "
                                                       "the verdict, best K and slices are at it.")] = "1",
    batch_sizes: Annotated[Optional[str], typer.Option("--batch-sizes", help="The speedup table's batch sizes "
                                                       "(roofline; default 1,2,4,8,16,32,64,128).")] = None,
    device_spec: Annotated[Optional[str], typer.Option("--device-spec", help="The roofline's device: h100, h200, b200, "
                                                       "a100, l40s, mi300x, or BW_GBps,TFLOPS (default h100).")] = None,
    context: Annotated[Optional[float], typer.Option("--context", help="Tokens of context per sequence for the "
                                                     "roofline (default: the run's mean anchor position).")] = None,
) -> None:
    """Acceptance, projected speedup and a go/no-go verdict for a run directory (imports no torch)."""
    from .cost import parse_batches
    from .presentation import markdown, plot as draw, print_rich
    from .report import parse_gate, read_and_summarize, report_json

    report_too = heatmap is None or fmt is not None or any(x is not None for x in (gate, plot, baseline, probe, draft_cost))
    fmt = fmt or "table"
    if fmt not in REPORT_FORMATS:
        raise OptionError(f"--format {fmt}: expected one of {', '.join(REPORT_FORMATS)}")
    if html is not None and heatmap is None:
        raise OptionError("--html FILE draws the --heatmap session: add --heatmap SESSION_ID")
    check_writable(plot, "--plot", (".png",))
    check_writable(html, "--html", (".html", ".htm"))
    if heatmap is not None and html is None and fmt != "table":
        raise OptionError(f"--heatmap prints to the terminal, which --format {fmt} keeps for the report: add --html FILE")
    loaded, view = None, None
    if heatmap is not None:  # the id is checked before any computing, and the heatmap alone is all that is shown
        from .heatmap import session_view
        from .report import load_run, newest_run

        loaded = load_run(run if run is not None else newest_run("reports"), drafter)
        view = session_view(loaded, heatmap)
        if not report_too:
            _show_heatmap(view, html)
            return
    reading = read_and_summarize(run, drafter=drafter, baseline=baseline, probe=probe, draft_cost=draft_cost,
                                 gate=parse_gate(gate) if gate is not None else None, min_support=min_support,
                                 recorded_with=recorded_with, replicates=replicates, seed=seed, batch=batch,
                                 batch_sizes=parse_batches(batch_sizes) if batch_sizes is not None else None,
                                 device_spec=device_spec, context=context, loaded=loaded)
    result, comparison = reading.report, reading.comparison
    if fmt == "json":
        print(json.dumps(report_json(result, comparison), indent=2))
    elif fmt == "markdown":
        print(markdown(result, comparison), end="")
    else:
        print_rich(result, comparison, out)
    sys.stdout.flush()
    if plot is not None:
        write_output(plot, "--plot", lambda p: draw(result, p, comparison))
    if view is not None:
        _show_heatmap(view, html)
    raise typer.Exit(code=result.verdict.exit_code)


def _show_heatmap(view, html: Optional[Path]) -> None:
    """The --heatmap session on the terminal, or as the --html page."""
    from .heatmap import html_page, print_terminal

    if html is not None:
        write_output(html, "--html", lambda p: p.write_text(html_page(view), encoding="utf-8"))
    else:
        print_terminal(view, out)


@app.command()
def export(
    run: Annotated[Optional[Path], typer.Argument(metavar="RUN", help="Run directory (default: the newest under reports/).")] = None,
    engine: Annotated[str, typer.Option(help="vllm, sglang, trtllm, speculation-profile or aiconfigurator.")] = "vllm",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write here (default: standard output).")] = None,
    k: Annotated[Optional[int], typer.Option("--k", help="Draft length to export (default: the report's best K).")] = None,
    drafter: Annotated[Optional[str], typer.Option("--drafter", help="The drafter to export (default: the winner of the "
                                                   "report's drafter ranking that the engine can run; a run of one "
                                                   "drafter: that one).")] = None,
    probe: Annotated[Optional[Path], typer.Option(help="probe.json: measured c and v(K) (they choose the best K).")] = None,
    draft_cost: Annotated[Optional[float], typer.Option(help="c = draft step / target decode step (default: roofline).")] = None,
    replicates: Annotated[int, typer.Option(help="Bootstrap resamples of sessions (the intervals written beside the values).")] = 1000,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
) -> None:
    """The run's acceptance as an engine's or planner's input: vLLM's speculative config (synthetic acceptance),
    SGLang's and TensorRT-LLM's simulated acceptance, Model-Optimizer's speculation_profile.json, AIConfigurator's
    nextn (imports no torch)."""
    from .engines import ENGINES, VLLM_DRAFTERS, export as render
    from .report import read_and_summarize

    if engine not in ENGINES:
        raise OptionError(f"--engine {engine}: expected one of {', '.join(ENGINES)}")
    check_writable(output, "--output")
    reading = read_and_summarize(run, drafter=drafter, probe=probe, draft_cost=draft_cost, replicates=replicates,
                                 seed=seed)
    if drafter is None and len(reading.report.ranking) > 1:
        # Several drafters on the same anchors: export the ranking's winner (each at its own best K, its own cost),
        # skipping those the engine cannot run (vLLM serves mtp, ngram and suffix, not the hybrids).
        servable = [r.drafter for r in reading.report.ranking if engine != "vllm" or r.drafter in VLLM_DRAFTERS]
        best = servable[0] if servable else reading.report.drafter
        if best != reading.report.drafter:
            reading = read_and_summarize(run, drafter=best, probe=probe, draft_cost=draft_cost, replicates=replicates,
                                         seed=seed)
        winner = reading.report.ranking[0].drafter
        said = "the best drafter of the run's ranking" if best == winner else \
            f"the best drafter of the run's ranking that {engine} runs ({winner} ranks first)"
        say(err, f"exporting {best}: {said}; --drafter NAME exports another")
    text = render(reading, engine, k)
    if output is None:
        sys.stdout.write(text)
    else:
        write_output(output, "--output", lambda p: p.write_text(text, encoding="utf-8"))


@app.command()
def compare(
    engine_metrics: Annotated[Path, typer.Option("--engine-metrics", help="What the engine measured on the same traffic: "
                                                 "vLLM /metrics text, vLLM responses with metrics.speculative_decoding "
                                                 "(JSON or JSON lines), or an SGLang log.")],
    run: Annotated[Optional[Path], typer.Argument(metavar="RUN", help="Run directory (default: the newest under reports/).")] = None,
    k: Annotated[Optional[int], typer.Option("--k", help="The engine's draft length where its file does not say "
                                             "(SGLang logs; default: the report's best K).")] = None,
    drafter: Annotated[Optional[str], typer.Option("--drafter", help="The drafter the engine ran (default: mtp when the "
                                                   "run has it, else its first).")] = None,
    probe: Annotated[Optional[Path], typer.Option(help="probe.json: measured c and v(K) (they choose the best K).")] = None,
    draft_cost: Annotated[Optional[float], typer.Option(help="c = draft step / target decode step (default: roofline).")] = None,
    replicates: Annotated[int, typer.Option(help="Bootstrap resamples of sessions.")] = 1000,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
) -> None:
    """The engine's own acceptance counters against the run's intervals: exit 0 when they agree, 1 when not."""
    from .engines import check, read_engine_metrics
    from .errors import EngineMetricsError
    from .report import read_and_summarize

    try:
        text = engine_metrics.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise EngineMetricsError(f"--engine-metrics {engine_metrics}: cannot read ({e.strerror or e})") from None
    measured = read_engine_metrics(text, str(engine_metrics))
    reading = read_and_summarize(run, drafter=drafter, probe=probe, draft_cost=draft_cost, replicates=replicates,
                                 seed=seed)
    result = check(reading.report, measured, k)
    t = Table(title=literal(f"engine ({measured.detail}) against run {reading.report.path} at K={result.k}"))
    for c in ("number", "engine", "run", f"run {result.level:.0%} interval", "agrees"):
        t.add_column(c, justify="left" if c == "number" else "right")
    for r in result.rows:
        t.add_row(r.name, f"{r.engine:.3f}", f"{r.run:.3f}", f"[{r.lo:.3f}, {r.hi:.3f}]", "yes" if r.within else "NO")
    out.print(t)
    say(out, ("AGREES: " if result.agrees else "DISAGREES: ") + result.reason)
    raise typer.Exit(code=result.exit_code)


@app.command()
def probe(
    model: Annotated[Path, typer.Argument(metavar="MODEL", help=MODEL_HELP)],
    context: Annotated[int, typer.Option(help="Tokens in the caches before each timed step (per sequence).")] = 4096,
    k: Annotated[int, typer.Option("--k", help="Time the verify of K+1 tokens for K = 1..k.")] = 4,
    device: Annotated[str, typer.Option(metavar=DEVICE_METAVAR, help="Where the step runs (auto: cuda if available).")] = "auto",
    dtype: Annotated[Dtype, typer.Option(help="auto: bfloat16 on CUDA, float32 on CPU.")] = "auto",
    repeats: Annotated[int, typer.Option(help="Timed repeats; the median is reported.")] = 20,
    batch: Annotated[str, typer.Option("--batch", help="Batch sizes to time, e.g. 1,2,4,8 (batch 1 is always timed).")] = "1",
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write probe.json.")] = Path("probe.json"),
) -> None:
    """Measured cost of one draft step, one target decode step and one verify of K+1 tokens, per batch size."""
    from .cost import parse_batches
    from .probe import CPU_NOTE, probe as measure, probe_json
    from .tables import write_json_atomic

    sizes = parse_batches(batch, "--batch")
    check_writable(output, "--output")
    from .hub import resolve_model

    result = measure(resolve_model(model, "MODEL"), context=context, k=k, device=device, dtype=dtype, repeats=repeats, batch=sizes)
    data = probe_json(result)
    write_json_atomic(output, data, hint="free space or choose another --output")
    ms = 1e3
    roof = result.roofline
    t = Table(title=literal(f"{model}: batch 1, context {context}, {result.device} ({result.device_name}) {result.dtype}, "
                            f"median of {repeats}"))
    for c in ("step", "measured", "per decode step", f"roofline at {roof['precision']}"):
        t.add_column(c, justify="left" if c == "step" else "right")
    t.add_row("target decode (1 token)", f"{result.target_decode.median_s * ms:.3f} ms", "1",
              f"1 ({human_bytes(roof['target_bytes'])} read)")
    t.add_row("draft step (c)", f"{result.draft_step.median_s * ms:.3f} ms", f"{result.draft_cost:.4f}",
              f"{roof['draft_cost']:.4f} ({human_bytes(roof['head_bytes'] + roof['lm_head_bytes'])} read)")
    for K, (timing, extra) in enumerate(zip(result.verify, result.verify_extra()), start=1):
        t.add_row(f"verify K={K} ({K + 1} tokens)", f"{timing.median_s * ms:.3f} ms", f"{1 + extra:.4f}  (v = {extra:+.4f})", "")
    out.print(t)
    if len(result.batches) > 1:
        by_batch = Table(title=literal(f"by batch size (B sequences, context {context} each): milliseconds per step, "
                                       "c_B = draft / decode, v_B(K) = verify / decode - 1"))
        for c in ("B", "decode", *[f"verify K={K}" for K in range(1, k + 1)], "draft", "c_B", "v_B(1..k)"):
            by_batch.add_column(c, justify="right")
        for b in result.batches:
            by_batch.add_row(str(b.batch), f"{b.target_decode.median_s * ms:.3f}",
                             *[f"{v.median_s * ms:.3f}" for v in b.verify], f"{b.draft_step.median_s * ms:.3f}",
                             f"{b.draft_cost:.4f}", " ".join(f"{v:+.3f}" for v in b.verify_extra()))
        out.print(by_batch)
    for b in result.batches:
        for flag in b.flags():
            say(out, f"flag: {flag}", style="yellow")
    for note in result.notes:
        say(out, f"note: {note}", style="yellow" if note == CPU_NOTE else None)
    say(out, f"wrote {output}; use it with: mtp-observe report --probe {output}")


@app.command("import")
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
    from .importers import FORMATS, OPTIONS_READ, Options, import_files

    if fmt != "auto" and fmt not in FORMATS:
        raise OptionError(f"FORMAT {fmt}: expected one of {', '.join(FORMATS)} or auto")
    _check_on_error(on_error)
    check_writable(output, "--output")
    if any(str(f) != "-" and output.resolve() == f.resolve() for f in files):
        raise OptionError(f"--output {output} is one of the input files; write the sessions elsewhere")
    for option, value in (("tools", tools), ("system_template", system_template)):
        readers = OPTIONS_READ[option]
        if value is not None and fmt != "auto" and fmt not in readers:
            raise OptionError(f"--{option.replace('_', '-')} applies to {', '.join(readers)}; name that FORMAT instead of {fmt}")
    counts = import_files(fmt, files, output, Options(tools=tools, system_template=system_template), on_error=on_error,
                          warn=lambda message: say(err, f"skipped: {message}"))
    for c in counts:
        notes = [c.format] + ([c.note] if c.note else []) + ([f"{len(c.skipped)} skipped"] if c.skipped else [])
        notes += [f"{n} {kind.replace('_', ' ')} dropped" for kind, n in sorted(c.dropped.items())]
        say(out, f"{c.path}: {plural(c.sessions, 'session')} ({', '.join(notes)})")
    total = sum(c.sessions for c in counts)
    say(out, f"wrote {plural(total, 'session')} to {output}")


def _quiet_libraries() -> None:
    """Library logging and warnings off (stderr holds our lines only): transformers reads its verbosity from
    the environment when first imported; Python warnings (torch's UserWarnings) are ignored."""
    import warnings

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.simplefilter("ignore")


def _choice_refusal(message: str) -> Optional[str]:
    """click's "Invalid value for '--format': 'x' is not one of 'table', 'markdown', 'json'." in this tool's
    words, "--format x: expected one of table, markdown, json"; None for any other message."""
    import re

    m = re.fullmatch(r"Invalid value for '([^']+)': (?:Value error, )?'(.*)' is not one of (.*)\.", message, re.S)
    if m is None:
        return None
    listed = ", ".join(re.findall(r"'([^']*)'", m.group(3)))
    return f"{m.group(1)} {m.group(2)}: expected one of {listed}"


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: run the app, turning user errors into one line and exit code 2."""
    debug = os.environ.get("MTP_OBSERVE_DEBUG") == "1"
    if not debug:
        _quiet_libraries()
    try:
        # Without standalone mode click returns a command's typer.Exit code instead of exiting.
        code = app(args=argv, standalone_mode=False, prog_name="mtp-observe")
    except UserError as e:
        if debug:
            raise
        say(err, f"error: {e}")
        sys.exit(e.exit_code)
    except Exception as e:
        # Click's own exceptions (typer may vendor click, so match by shape, not by class).
        kind = type(e).__name__
        if kind == "NoArgsIsHelpError":
            out.print(literal(e.format_message(), newlines=True), soft_wrap=True)
            sys.exit(0)
        if kind == "Exit":
            sys.exit(getattr(e, "exit_code", 0))
        if kind == "Abort":
            say(err, "aborted")
            sys.exit(130)
        if hasattr(e, "format_message") and hasattr(e, "exit_code") and not debug:
            choice = _choice_refusal(e.format_message())
            if choice is not None:
                say(err, f"error: {choice}")
                sys.exit(2)
            ctx = getattr(e, "ctx", None)
            hint = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
            say(err, f"error: {e.format_message()}{hint}")
            sys.exit(2)
        raise
    sys.exit(code if isinstance(code, int) else 0)
