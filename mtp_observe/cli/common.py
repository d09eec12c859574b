"""The command line's shared parts: the app, the consoles, option types and helpers, and `main`.

Each command (model.py, inputs.py, replaying.py, reading.py; registered in cli/__init__.py) checks its options,
calls the library once, and prints.

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

import os
import sys
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from rich.console import Console

from ..errors import OptionError, UserError
from ..literal import literal

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
        from .. import __version__

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
ShardBy = Literal["id", "tokens"]
ReportFormat = Literal["table", "markdown", "json"]
Traffic = Literal["same", "other"]  # compare --traffic (engine_check.TRAFFIC)
Dtype = Literal["auto", "float32", "bfloat16"]
DEVICE_METAVAR = "<auto|cpu|cuda|cuda:N>"  # cuda:N is open-ended, so not a Choice; pipeline.resolve_device checks it


def human_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


MODEL_HELP = "Checkpoint directory, or a Hugging Face id (ORG/NAME[@REVISION]) already in the local cache (never downloaded)."


SEGMENT_STYLES = {"reasoning": "magenta", "text": "green", "tool_call": "cyan", "end": "bold red"}


def _model_dir(model: Optional[Path]) -> Path:
    """--model (a directory, or a hub id in the local cache), or the bundled model, said on stdout (stderr is
    kept for the error line of a failure)."""
    from ..model.hub import resolve_model
    from ..model.loading import default_model_dir

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
    """--chat-template and --template-kwargs, checked once (templates.template_overrides)."""
    from ..sessions.templates import template_overrides

    return template_overrides(chat_template, template_kwargs)


def _check_on_error(on_error: str) -> None:
    if on_error not in ("fail", "skip"):
        raise OptionError(f"--on-error {on_error}: expected fail or skip")


def shard_options(shard: Optional[str], shard_by: str, command: str = "replay"):
    """--shard I/N and --shard-by -> shards.Shard (None without --shard)."""
    from ..run.shards import parse_shard

    if shard is None:
        if shard_by != "id":
            raise OptionError(f"--shard-by {shard_by}: without --shard, {command} covers every session; add --shard I/N")
        return None
    return parse_shard(shard, shard_by)


REPORT_FORMATS = ("table", "markdown", "json")


def check_writable(path: Optional[Path], option: str, suffixes: tuple[str, ...] = (), inputs=(), kept=()) -> None:
    """Refuse before the work, not after it, an output file that would destroy a run or one of the command's
    inputs (`inputs`: its files and the directories it reads whole; `kept`: the checkpoint, whose files it reads),
    a directory, a file of the wrong kind, or one in a directory that does not exist or cannot be written
    (outputs.check_output; access(2) says so for a read-only mount or an immutable directory, root too)."""
    from ..outputs import check_output

    check_output(path, option, inputs=inputs, kept=kept, suffixes=suffixes)


def write_output(path: Path, option: str, write, announce: bool = True) -> None:
    """write(a temporary) renamed over path (outputs.write_atomic), with an OS failure (a full disk, a read-only
    directory) as one line naming the option; what was at path stays. announce=False leaves the "wrote PATH" line
    to the caller (export says the verdict first, then what it wrote)."""
    from ..outputs import write_atomic

    try:
        write_atomic(path, write)
    except OSError as e:
        raise OptionError(f"{option} {path}: cannot write ({e.strerror or e}); choose another path") from None
    if announce:
        say(err, f"wrote {path}")


def finite_floats(command):
    """The command, refusing a float option that is NaN or infinite (`--suffix-max-spec-factor nan` would reach
    run.json and the engines' configs as a bare NaN, which is not JSON): one line, exit 2, before the command runs.
    click parses "nan", "inf" and "1e400" as floats; no option of this tool means any of them."""
    import functools
    import math
    import typing

    hints = typing.get_type_hints(command, include_extras=True)
    flags = {}
    for name, hint in hints.items():
        base, *extras = typing.get_args(hint) if typing.get_origin(hint) is Annotated else (hint,)
        if float not in (base, *typing.get_args(base)):
            continue
        declared = [d for x in extras if hasattr(x, "param_decls")  # Annotated: typer keeps the first flag as `default`
                    for d in ([x.default] if isinstance(x.default, str) else []) + list(x.param_decls or ())]
        flags[name] = next((d for d in declared if d.startswith("--")), "--" + name.replace("_", "-"))

    @functools.wraps(command)
    def checked(*args, **kwargs):
        for name, flag in flags.items():
            value = kwargs.get(name)
            if isinstance(value, float) and not math.isfinite(value):
                raise OptionError(f"{flag} {value}: expected a finite number")
        return command(*args, **kwargs)

    return checked


def _quiet_libraries() -> None:
    """Library logging and warnings off (stderr holds our lines only): transformers reads its verbosity from
    the environment when first imported (a TRANSFORMERS_VERBOSITY the user set too: MTP_OBSERVE_DEBUG=1 is the way
    to see the libraries), and is told again if it is imported already; its kernel-fallback warnings are caught
    for the replay's summary to say once (kernels.py); Python warnings (torch's UserWarnings) are ignored."""
    import warnings

    from ..model.kernels import capture

    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.set_verbosity_error()
    capture()
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
