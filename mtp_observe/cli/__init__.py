"""The command line: each command checks its options, calls the library once, and prints.

The commands live by what they work on — model.py (inspect, probe), inputs.py (import, sessions, generate),
replaying.py (replay), merging.py (merge), reading.py (report, export, compare) — and are registered here, in the order `--help`
lists them; common.py holds the app, the consoles, the option types, the shared helpers and `main` (errors a user
can cause become one line and exit code 2); every command's float options are refused when NaN or infinite
(`finite_floats`, applied to each command once it is registered).
"""

from __future__ import annotations

from . import inputs, merging, model, reading, replaying
from .common import app, finite_floats, main

app.command()(model.inspect)
app.command()(inputs.sessions)
app.command()(replaying.replay)
app.command()(merging.merge)
app.command()(inputs.generate)
app.command()(reading.report)
app.command()(reading.export)
app.command()(reading.compare)
app.command()(model.probe)
app.command("import")(inputs.import_)
for _registered in app.registered_commands:  # every command's float options are finite numbers (common.finite_floats)
    _registered.callback = finite_floats(_registered.callback)

__all__ = ["app", "main"]
