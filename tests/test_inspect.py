"""`mtp-observe inspect`: the S0 table, from safetensors headers only."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

from mtp_observe.cost.inventory import take_inventory
from mtp_observe.model.checkpoint import read_checkpoint


def inspect_json(path: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "mtp_observe", "inspect", str(path), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def header_sizes(path: Path) -> dict[str, int]:
    """name -> data bytes, read independently of the product from every shard's header."""
    sizes = {}
    for f in path.glob("*.safetensors"):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name != "__metadata__":
                sizes[name] = meta["data_offsets"][1] - meta["data_offsets"][0]
    return sizes


def test_inspect_byte_totals_equal_the_sums_of_the_header_sizes(make_checkpoint):
    path = make_checkpoint(shards=3)
    sizes = header_sizes(path)
    report = inspect_json(path)
    head = {k: v for k, v in sizes.items() if k.startswith("mtp.")}
    assert report["head"]["count"] == 15 == len(head)
    assert isinstance(report["head"]["bytes"], int)
    assert report["head"]["bytes"] == sum(head.values())
    assert {t["name"]: t["bytes"] for t in report["head"]["tensors"]} == head
    target = {k: v for k, v in sizes.items() if not k.startswith(("mtp.", "model.visual."))}
    assert report["target"]["bytes"] == sum(target.values())
    stored = report["precisions"]["stored"]
    assert stored["lm_head_bytes"] == sizes["lm_head.weight"]
    assert stored["draft_cost"] == (sum(head.values()) + sizes["lm_head.weight"]) / sum(target.values())
    borrowed = {b["role"]: b for b in report["borrowed"]}
    assert borrowed["embedding"]["bytes"] == sizes["model.language_model.embed_tokens.weight"]


def test_inspect_counts_a_tied_lm_head_once_as_the_embedding(make_checkpoint):
    path = make_checkpoint(tie_word_embeddings=True, shards=1)
    report = inspect_json(path)
    sizes = header_sizes(path)
    assert [b["role"] for b in report["borrowed"]] == ["embedding+lm_head"]
    assert report["precisions"]["stored"]["lm_head_bytes"] == sizes["model.language_model.embed_tokens.weight"]
    assert "lm_head.weight" not in sizes


def test_inspect_precisions_follow_bits_per_weight(tiny_checkpoint):
    inv = take_inventory(read_checkpoint(tiny_checkpoint))
    matrices = sum(e.numel for e in inv.head if len(e.shape) == 2)
    vectors = sum(e.numel for e in inv.head if len(e.shape) == 1)
    assert inv.head_bytes("BF16") == 2 * (matrices + vectors)
    fc = inv.config["hidden_size"] * 2 * inv.config["hidden_size"]  # FP8 releases keep mtp.fc in BF16
    assert inv.head_bytes("FP8") == (matrices - fc) + 2 * fc + 2 * vectors
    assert inv.lm_head_bytes("FP8") == inv.lm_head_bytes("BF16")  # and the lm_head and embeddings
    assert inv.head_bytes("Q6_K") == -(-(matrices * 6.5625 + vectors * 32) // 8)
    assert inv.head_bytes("Q4_K") < inv.head_bytes("Q6_K") < inv.head_bytes("Q8_0") < inv.head_bytes("BF16")


def test_inspect_reads_headers_only_not_the_tensor_data(make_checkpoint, monkeypatch):
    """Every byte read from the shards is a header: inspect answers at once on a 60 GB checkpoint."""
    import builtins

    from mtp_observe.cost.inventory import inventory_json

    path = make_checkpoint(shards=3)
    header_bytes = 0
    for f in path.glob("*.safetensors"):
        with open(f, "rb") as fh:
            header_bytes += 8 + struct.unpack("<Q", fh.read(8))[0]
    data_bytes = sum(f.stat().st_size for f in path.glob("*.safetensors")) - header_bytes
    read = [0]
    real_open = builtins.open

    class Counting:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            out = self.f.read(n)
            read[0] += len(out)
            return out

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def __getattr__(self, name):
            return getattr(self.f, name)

    def spy(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return Counting(f) if str(file).endswith(".safetensors") else f

    monkeypatch.setattr(builtins, "open", spy)
    report = inventory_json(take_inventory(read_checkpoint(path)))
    assert report["head"]["count"] == 15
    assert 0 < read[0] <= header_bytes < data_bytes, (read[0], header_bytes, data_bytes)


def test_inspect_prints_the_table_with_every_head_tensor(tiny_checkpoint):
    r = subprocess.run([sys.executable, "-m", "mtp_observe", "inspect", str(tiny_checkpoint)],
                       capture_output=True, text=True, env={"COLUMNS": "200", "PATH": ""})
    assert r.returncode == 0, r.stderr
    for name in ("mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight", "lm_head.weight", "Q6_K", "Q4_K", "draft"):
        assert name in r.stdout
