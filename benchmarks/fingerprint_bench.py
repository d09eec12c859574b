"""How long the weights fingerprint takes on a 60 GB checkpoint (fingerprints.weights_fingerprint).

Writes a sparse checkpoint — safetensors shards with real headers (BF16 tensors in the proportions of
a large dense model) whose data regions are holes — and times the sampled fingerprint over it, and
the whole-file hash over the first GB for comparison. Holes read as zeros without touching the disk,
so this measures what the fingerprint costs in reads issued and bytes hashed, not the device's seek
time: on a cold NVMe disk add about (sampled blocks) x 0.1 ms.

    python benchmarks/fingerprint_bench.py [--gb 60] [--shards 25] [--tensors 1500] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import tempfile
import time
from pathlib import Path


def sparse_checkpoint(directory: Path, total_bytes: int, shards: int, tensors: int) -> list[Path]:
    """`shards` safetensors files holding `tensors` BF16 tensors in all (sizes from 16 kB norms to large
    matrices), total data about `total_bytes`, written as sparse files: only the headers take disk space."""
    per_shard = tensors // shards
    # One norm-sized tensor for every three matrices, as in a transformer layer; matrices share the rest.
    small = 16 * 1024
    n_small = per_shard // 4
    n_big = per_shard - n_small
    big = max(2, (total_bytes // shards - n_small * small) // n_big) // 2 * 2
    files = []
    for s in range(shards):
        header, offset = {}, 0
        for t in range(per_shard):
            nbytes = small if t % 4 == 3 else big
            header[f"model.layers.{s}.t{t}.weight"] = {"dtype": "BF16", "shape": [nbytes // 2],
                                                       "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        path = directory / f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + offset)
        files.append(path)
    return files


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from mtp_observe.model.fingerprints import sampled_fingerprint_of_files, whole_fingerprint_of_files

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=60.0)
    ap.add_argument("--shards", type=int, default=25)
    ap.add_argument("--tensors", type=int, default=1500)
    ap.add_argument("--keep", type=Path, default=None, help="write the checkpoint here (default: a temporary directory)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.keep or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        files = sparse_checkpoint(directory, int(args.gb * 1e9), args.shards, args.tensors)
        t0 = time.perf_counter()
        sampled = sampled_fingerprint_of_files(files)
        t_sampled = time.perf_counter() - t0
        first_gb = directory / "first-gb.bin"
        with open(first_gb, "wb") as f:
            f.truncate(10**9)
        t0 = time.perf_counter()
        whole_fingerprint_of_files([first_gb])
        t_whole = time.perf_counter() - t0
        first_gb.unlink()
    reads = sampled["sampled_bytes"] // sampled["block_bytes"]
    print(f"checkpoint: {sampled['bytes'] / 1e9:.1f} GB in {len(files)} shards, {args.tensors} tensors (sparse file)")
    print(f"sampled fingerprint: {t_sampled:.3f} s, {sampled['sampled_bytes'] / 1e6:.1f} MB read in about {reads:,} blocks")
    print(f"whole-file sha256 of 1 GB for comparison: {t_whole:.2f} s (the whole checkpoint: ~{t_whole * args.gb:.0f} s)")


if __name__ == "__main__":
    main()
