"""Import and render the whole public corpus: every folder of ../shared/sessions-public, `import auto` on
the folder (a directory input), then every session rendered with the bundled model's tokenizer and
chat template — the two costs a user pays before a replay, timed apart.

    python benchmarks/corpus_bench.py [--root DIR] [--only FOLDER,FOLDER] [--json OUT]

What the corpus lacks is built as the tests build it (tests/log_samples.py): the otel-genai folder holds
the semantic conventions' examples, turned into an OTLP export; the openai-batch folder an input file,
given its output file; a vLLM log written in the documented format. Files in a folder that are no log
(SOURCE.txt, schemas, tool lists) are skipped by `auto`, as for any directory.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=None, help="the corpus (default: the one the tests read, tests/conftest.py)")
    parser.add_argument("--only", default="", help="comma-separated folder names (default: every folder)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from mtp_observe.model.loading import default_model_dir
    from mtp_observe.sessions.importers import import_files
    from mtp_observe.sessions.reading import read_sessions
    from mtp_observe.sessions.rendering import Renderer
    from tests import log_samples
    from tests.conftest import SESSIONS_PUBLIC

    args.root = args.root or SESSIONS_PUBLIC
    if args.root is None or not args.root.is_dir():
        sys.exit("no corpus: pass --root ../shared/sessions-public")
    log_samples.SESSIONS_PUBLIC = args.root
    renderer = Renderer.from_model_dir(default_model_dir(), vocab_size=4096)
    folders = sorted(p for p in args.root.iterdir() if p.is_dir())
    if args.only:
        folders = [p for p in folders if p.name in args.only.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # The two OTLP files hold the same spans in two attribute encodings, so the same session ids: one
        # import would refuse the second copy (ids are unique within a run), so each is imported on its own.
        text_otlp, structured_otlp = log_samples.write_otel_samples(tmp)
        extra = {"openai-batch": [log_samples.write_batch_output(tmp / "batch_output.jsonl")], "otel-genai": [text_otlp]}
        conversation = log_samples.bundled_conversation_ids(renderer.tokenizer)
        vllm = tmp / "vllm-server.log"
        vllm.write_text("\n".join(line for k, (pt, pi, oi, ot) in enumerate(conversation)
                                  for line in log_samples.vllm_request_lines(f"chatcmpl-{k}", pt, pi, oi, ot, n=k)) + "\n")
        inputs = [(p.name, [p, *extra.get(p.name, [])]) for p in folders]
        if any(p.name == "otel-genai" for p in folders):
            inputs.append(("otel-genai (structured encoding)", [structured_otlp]))
        if not args.only:
            inputs.append(("vllm-log (built)", [vllm]))
        for name, files in inputs:
            out = tmp / "out.jsonl"
            t0 = time.perf_counter()
            counts = import_files("auto", files, out, warn=lambda message: None)
            t1 = time.perf_counter()
            sessions = tokens = turns = 0
            for s in read_sessions([out]):
                rendered = renderer.render(s)
                sessions += 1
                tokens += rendered.n_tokens
                turns += sum(len(r.spans) for r in rendered.requests)
            t2 = time.perf_counter()
            formats = sorted({c.format for c in counts if c.format != "?"})
            rows.append({"folder": name, "formats": formats, "files": sum(1 for c in counts if c.format != "?"), "sessions": sessions,
                         "turns": turns, "tokens": tokens, "import_s": round(t1 - t0, 3), "render_s": round(t2 - t1, 3)})
            print(f"{name:34} {','.join(formats):28} {rows[-1]['files']:3} files {sessions:4} sessions {turns:6} turns "
                  f"{tokens:>11,} tokens  import {t1 - t0:7.2f} s  render {t2 - t1:8.2f} s", flush=True)
    total = {key: sum(r[key] for r in rows) for key in ("files", "sessions", "turns", "tokens", "import_s", "render_s")}
    print(f"{'total':63} {total['files']:3} files {total['sessions']:4} sessions {total['turns']:6} turns {total['tokens']:>11,} tokens  "
          f"import {total['import_s']:7.2f} s  render {total['render_s']:8.2f} s")
    if args.json:
        args.json.write_text(json.dumps({"folders": rows, "total": total}, indent=2))


if __name__ == "__main__":
    main()
