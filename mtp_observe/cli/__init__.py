"""The command line: each command checks its options, calls the library once, and prints.

The commands live by what they work on — model.py (inspect, probe), inputs.py (import, sessions, generate),
replaying.py (replay), merging.py (merge), reading.py (report, export, compare) — and are registered here, in the order `--help`
lists them; common.py holds the app, the consoles, the option types, the shared helpers and `main` (errors a user
can cause become one line and exit code 2).
"""

from __future__ import annotations

from . import inputs, merging, model, reading, replaying
from .common import app, main

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

__all__ = ["app", "main"]
