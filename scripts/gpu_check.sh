#!/usr/bin/env bash
# One prepared check for a CUDA machine with no network, meant to finish in under 8 minutes:
#   1. the CUDA-marked tests,
#   2. the replay benchmark at the real Qwen3.5-0.8B dimensions and at the Qwen3.5-27B width
#      (GPU_CHECK_27B_LAYERS of its 64 layers; time and FLOPs scale per layer), random weights, bf16,
#   3. `mtp-observe probe` on the 0.8B-dimension checkpoint,
# and prints the rows of the README's GPU table (tokens/s, ratio to bare prefill, MFU, peak GPU
# memory, draft cost c). Everything it needs is in the repository and the installed packages.
#
#   bash scripts/gpu_check.sh                 # on the GPU machine, from the repository root
#   OUT=/some/dir bash scripts/gpu_check.sh   # where the JSON results go (default: a temp dir)
#
# Knobs (environment): GPU_CHECK_SESSIONS (tau-bench sessions replayed, default 4),
# GPU_CHECK_27B_LAYERS (default 4), GPU_CHECK_CONTEXT (probe context, default 4096), and for a CPU
# smoke test of the script itself GPU_CHECK_DEVICE=cpu GPU_CHECK_DIMS=small GPU_CHECK_DTYPE=float32.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
SESSIONS="${GPU_CHECK_SESSIONS:-4}"
LAYERS_27B="${GPU_CHECK_27B_LAYERS:-4}"
CONTEXT="${GPU_CHECK_CONTEXT:-4096}"
DIMS_SMALL="${GPU_CHECK_DIMS:-0.8b}"
DTYPE="${GPU_CHECK_DTYPE:-bfloat16}"
start=$(date +%s)

python - <<EOF
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())
if "$DEVICE".startswith("cuda"):
    assert torch.cuda.is_available(), "no CUDA device visible"
    print(torch.cuda.get_device_name(0), round(torch.cuda.get_device_properties(0).total_memory / 2**30), "GiB")
for name in ("fla", "causal_conv1d"):
    try:
        __import__(name); print(name, "installed: transformers uses its kernels for the linear-attention layers")
    except ImportError:
        print(name, "not installed: the linear-attention layers use the PyTorch reference path (slower)")
EOF

if [ "$DEVICE" != "cpu" ]; then
  echo "== 1. CUDA-marked tests"
  python -m pytest -m cuda -q -p no:cacheprovider -rs tests
fi

echo "== 2a. replay benchmark: ${DIMS_SMALL} dimensions, bf16"
python benchmarks/replay_bench.py --dims "$DIMS_SMALL" --device "$DEVICE" --dtype "$DTYPE" \
  --sessions "$SESSIONS" --keep-model "$OUT/model-small" --json "$OUT/bench-small.json"

if [ "$DEVICE" != "cpu" ]; then
  echo "== 2b. replay benchmark: Qwen3.5-27B width, ${LAYERS_27B} of 64 layers, bf16"
  python benchmarks/replay_bench.py --dims 27b --layers "$LAYERS_27B" --device "$DEVICE" --dtype "$DTYPE" \
    --sessions "$SESSIONS" --json "$OUT/bench-27b.json"
fi

echo "== 3. probe on the ${DIMS_SMALL}-dimension checkpoint"
python -m mtp_observe probe "$OUT/model-small" --device "$DEVICE" --dtype "$DTYPE" --context "$CONTEXT" --k 4 \
  -o "$OUT/probe.json"

echo "== README GPU table rows"
python - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
probe = json.loads((out / "probe.json").read_text())
print("| model dims | layers | tokens | tokens/s | replay / bare prefill | FLOP floor | MFU | peak GPU GB | draft cost c (measured / roofline) |")
print("|---|---|---|---|---|---|---|---|---|")
for name in ("bench-small.json", "bench-27b.json"):
    p = out / name
    if not p.exists():
        continue
    b = json.loads(p.read_text())
    c = f"{probe['draft_cost']:.3f} / {probe['roofline']['draft_cost']:.3f}" if name == "bench-small.json" else ""
    print(f"| {b['dims']} | {b['layers']} | {b['tokens']:,} | {b['tokens_per_s']:,.0f} | {b['ratio']} | {b['flop_floor_ratio']} "
          f"| {b.get('mfu', '')} | {b.get('peak_gpu_gb', '')} | {c} |")
print(f"device: {probe.get('device_name')}  probe context {probe['context']}: draft step {probe['timings_s']['draft_step']*1e3:.2f} ms, "
      f"target decode {probe['timings_s']['target_decode']*1e3:.2f} ms")
EOF
echo "results in $OUT; total $(( $(date +%s) - start )) s"
