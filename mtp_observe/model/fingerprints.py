"""Fingerprints: what identifies a checkpoint's weights and its tokenizer in run.json, read cheaply and exactly.

Contract: `weights_fingerprint(info)` hashes a small checkpoint whole and samples blocks of every tensor of a large
one (the first, the last and evenly spaced ones: a changed tensor changes the fingerprint with high probability,
at a cost independent of the checkpoint's size); `tokenizer_sha256(path)` hashes the tokenizer files and template.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

from ..errors import CheckpointError
from .checkpoint import CheckpointInfo


def tokenizer_sha256(path: Path) -> str:
    """sha256 over the tokenizer files present (tokenizer.json, tokenizer_config.json, chat template)."""
    h = hashlib.sha256()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
                 "special_tokens_map.json", "vocab.json", "merges.txt"):
        p = Path(path) / name
        if p.is_file():
            h.update(name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


WHOLE_FILE_LIMIT = 256 * 2**20  # checkpoints up to this many bytes are hashed whole


FINGERPRINT_BLOCK = 4096  # bytes per sampled block


BLOCKS_PER_TENSOR = 16  # sampled blocks per tensor: the first, the last and 14 evenly spaced between


def weights_fingerprint(info: CheckpointInfo, whole_file_limit: int = WHOLE_FILE_LIMIT) -> dict:
    """A content fingerprint of every weight file of the checkpoint.

    Up to `whole_file_limit` bytes in all: sha256 of every file whole. Larger: sha256 of every file's
    name, size and whole safetensors header, and of BLOCKS_PER_TENSOR blocks of FINGERPRINT_BLOCK bytes
    spread evenly over the data region of every tensor of every shard (a tensor smaller than that is
    read whole), so that new values in any tensor — a fine-tune, a retrained head alone — change it. It
    reads about tensors x 64 kB (a Qwen3.5-27B checkpoint: ~60 MB of its 55 GB; docs/replay.md, `--resume`).
    A change confined to a few bytes no sampled block covers is not seen: that is the price of not
    reading 60 GB at every start.
    """
    files = sorted({info.path / t.file for t in info.tensors.values()})
    try:
        total = sum(f.stat().st_size for f in files)
    except OSError as e:
        raise CheckpointError(f"{info.path}: cannot read its weight files ({e.strerror}); check the checkpoint")
    if total <= whole_file_limit:
        return whole_fingerprint_of_files(files)
    return sampled_fingerprint_of_files(files)


def whole_fingerprint_of_files(files: list[Path]) -> dict:
    h = hashlib.sha256()
    total = 0
    for f in files:
        try:
            with open(f, "rb") as fh:
                h.update(f.name.encode() + b"\0")
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
                    total += len(block)
        except OSError as e:
            raise CheckpointError(f"{f}: cannot read ({e.strerror}); check the checkpoint")
    return {"method": "whole files", "sha256": h.hexdigest(), "bytes": total, "files": len(files)}


def _sample_offsets(begin: int, end: int, block: int, blocks: int) -> list[int]:
    """Start offsets of the sampled blocks of data region [begin, end): every block when the region is at most
    `blocks` blocks long, else `blocks` evenly spaced starts from `begin` to `end - block`."""
    length = end - begin
    if length <= block * blocks:
        return list(range(begin, end, block))
    return [begin + (i * (length - block)) // (blocks - 1) for i in range(blocks)]


def sampled_fingerprint_of_files(files: list[Path], block: int = FINGERPRINT_BLOCK,
                                 blocks: int = BLOCKS_PER_TENSOR) -> dict:
    import os

    h = hashlib.sha256()
    total = sampled = 0
    for f in files:
        try:
            with open(f, "rb") as fh:
                fd = fh.fileno()
                size = os.fstat(fd).st_size
                (length,) = struct.unpack("<Q", os.pread(fd, 8, 0))
                header_bytes = os.pread(fd, length, 8) if length <= 100_000_000 else b""
                header = json.loads(header_bytes)
                regions = sorted(tuple(m["data_offsets"]) for n, m in header.items() if n != "__metadata__")
                h.update(f.name.encode() + b"\0" + str(size).encode() + b"\0" + header_bytes)
                for begin, end in regions:
                    for offset in _sample_offsets(int(begin), int(end), block, blocks):
                        data = os.pread(fd, min(block, int(end) - offset), 8 + length + offset)
                        h.update(data)
                        sampled += len(data)
        except OSError as e:
            raise CheckpointError(f"{f}: cannot read ({e.strerror}); check the checkpoint")
        except (ValueError, TypeError, KeyError, struct.error) as e:
            raise CheckpointError(f"{f}: not a readable safetensors file ({e}); re-download or re-save this shard")
        total += size
    return {"method": "sampled blocks", "sha256": h.hexdigest(), "bytes": total, "files": len(files),
            "sampled_bytes": sampled, "block_bytes": block, "blocks_per_tensor": blocks}
