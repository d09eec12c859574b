"""Each format's round trip pinned by value on known blocks (ragged and all-zero ones among them), against its reference:
the `gguf` package (its Q8_0 / Q5_0 quantisers, every GGUF dequantiser), ggml's C reference (ggml-org/ggml@d99724f2
src/ggml-quants.c, built and run on these exact inputs to record the digests below), NVIDIA Model-Optimizer's
nvfp4_tensor.py (run on these inputs for the digests below) and the block-FP8 writer and loader of this repository."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from mtp_observe.model import quantisers as Q
from mtp_observe.model.synthetic import quantize_fp8_blockwise
from mtp_observe.model.weights import dequantize_blockwise

gguf = pytest.importorskip("gguf", reason="the gguf package (the test extra) pins the GGUF round trips")
GGUF_TYPES = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q5_0": gguf.GGMLQuantizationType.Q5_0,
              "q6_k": gguf.GGMLQuantizationType.Q6_K, "q4_k": gguf.GGMLQuantizationType.Q4_K}


def known_values(n: int, seed: int) -> np.ndarray:
    """n exact float32 integers in [-2^23, 2^23) from integer hashing (no random generator whose stream could move)."""
    i = np.arange(n, dtype=np.uint64)
    h = (i * np.uint64(2654435761) + np.uint64(seed) * np.uint64(40503) + np.uint64(12345)) % np.uint64(1 << 32)
    h = (h ^ (h >> np.uint64(13))) * np.uint64(1274126177) % np.uint64(1 << 32)
    return ((h >> np.uint64(8)).astype(np.int64) - (1 << 23)).astype(np.float32)


def gguf_blocks() -> np.ndarray:
    """29 blocks of 256: 24 at scales 2^-20..2^-39 (an outlier x64 in every fifth), then an all-zero block, one whose
    first 64 values are zero (q4_K's and q6_K's zero sub-blocks), a constant, one below GROUP_MAX_EPS, one lone value."""
    blocks = []
    for b in range(24):
        x = known_values(256, b) * np.float32(2.0 ** (-(b % 20) - 20))
        if b % 5 == 0:
            x[b] *= np.float32(64.0)
        blocks.append(x)
    blocks.append(np.zeros(256, np.float32))
    x = known_values(256, 99) * np.float32(2.0 ** -30)
    x[:64] = 0
    blocks.append(x)
    blocks.append(np.full(256, 0.3, np.float32))
    blocks.append(known_values(256, 7) * np.float32(2.0 ** -80))
    x = np.zeros(256, np.float32)
    x[200] = -3.0
    blocks.append(x)
    return np.concatenate(blocks)


def digest(a) -> str:
    a = a.contiguous().numpy() if isinstance(a, torch.Tensor) else np.ascontiguousarray(a)
    return hashlib.sha256(a.tobytes()).hexdigest()


# sha256 of ggml's C output on gguf_blocks(): (quantize_row_<type>_ref bytes, dequantize_row_<type> float32 values)
GGML_C = {
    "q8_0": ("e59a4a2ecf630395f5a8d9ec54740145db632adcf2eca9dae412e56481c4ada4",
             "d4f5ef37a4b98eb05ec30a0ae0676e643e1f1483d3f8cac7c128acc25c345b53"),
    "q5_0": ("304715a5f686093ed71f02160e421f4e44c9a84526c317b1955c7f7ad96e483a",
             "ba7dbc7b838210b51025e35fb954597baa3e246c011c325bc9c9623a8877074e"),
    "q6_k": ("1be44bc67312e4fbab6bc14c4cdc8393d8bb08d14a5604403687bd7802251546",
             "7c474896d72630c13c3d937252361b77f8dc361b82d22d9cefeb6feb6fcd1f5f"),
    "q4_k": ("f2656676a97281efb88e24ced3b08bd566f7e9967f777eb8688a23bee6944fff",
             "02c35bf4e976d6d52b7e48dd79927b626d2c80b701598527cd6b477f31f6e171"),
}


@pytest.mark.parametrize("fmt", list(GGML_C))
def test_the_gguf_blocks_are_ggml_c_reference_bytes_and_the_gguf_package_reads_them_back(fmt):
    x = gguf_blocks()
    assert digest(x) == hashlib.sha256(x.tobytes()).hexdigest()  # the inputs themselves are exact
    packed = Q.gguf_quantise(torch.from_numpy(x), fmt)
    values = Q.gguf_dequantise(packed, fmt)
    assert digest(packed) == GGML_C[fmt][0]
    assert digest(values) == GGML_C[fmt][1]
    theirs = gguf.quants.dequantize(packed.numpy(), GGUF_TYPES[fmt]).reshape(-1)
    assert np.array_equal(theirs.view(np.uint32), values.numpy().view(np.uint32))
    assert torch.equal(Q.round_trip(torch.from_numpy(x).reshape(-1, 256), fmt).reshape(-1), values)


@pytest.mark.parametrize("fmt", ["q8_0", "q5_0"])
def test_q8_0_and_q5_0_equal_the_gguf_packages_own_quantiser(fmt):
    x = gguf_blocks().reshape(-1, 32)
    theirs = gguf.quants.quantize(x, GGUF_TYPES[fmt]).reshape(-1, int(Q.FORMATS[fmt].block_bytes))
    assert np.array_equal(Q.gguf_quantise(torch.from_numpy(x), fmt).numpy(), theirs)


def test_q8_0_on_a_worked_block_rounds_half_away_from_zero_with_the_fp16_scale():
    x = torch.arange(32, dtype=torch.float32) - 16  # amax 16: d = 16/127, codes roundf(x * 127/16)
    block = Q.quantize_q8_0(x)[0]
    assert bytes(block[:2].tolist()).hex() == "0830"  # fp16(0.12598) = 0x3008, little endian
    codes = block[2:].view(torch.int8).tolist()
    assert codes[:3] == [-127, -119, -111] and codes[16:19] == [0, 8, 16] and codes[-1] == 119
    assert codes[8] == -64  # x = -8: -63.5 rounds away from zero (half to even would give -64 too; see 71 below)
    assert codes[25] == 71  # x = 9: 71.4375


def test_an_all_zero_gguf_block_serves_zeros_and_packs_as_the_c_code_packs_it():
    zero = torch.zeros(256)
    for fmt in GGML_C:
        packed = Q.gguf_quantise(zero, fmt)
        assert torch.equal(Q.gguf_dequantise(packed, fmt).abs(), zero), fmt
        if fmt != "q5_0":
            assert int(packed.sum()) == 0, fmt  # q8_0 d = 0; q6_K memset; q4_K d = dmin = 0 and codes 0
    # q5_0: d = max / -16 = -0.0 (fp16 0x8000) and every code 16 (zero after the -16): bit 4 set in qh
    assert Q.quantize_q5_0(torch.zeros(32))[0].tolist() == [0, 128, 255, 255, 255, 255] + [0] * 16


def test_a_gguf_row_that_is_not_a_multiple_of_the_block_is_refused_here():
    with pytest.raises(ValueError, match="not a multiple of its block of 256"):
        Q.gguf_quantise(torch.ones(3, 192), "q4_k")


def test_quantising_in_chunks_equals_one_pass():
    x = torch.from_numpy(np.tile(gguf_blocks(), 8))  # 59,392 values
    old = Q.CHUNK
    try:
        Q.CHUNK = 4096
        chunked = Q.gguf_quantise(x, "q4_k")
    finally:
        Q.CHUNK = old
    assert torch.equal(chunked, Q.gguf_quantise(x, "q4_k"))


# --- NVFP4 (ModelOpt export) -------------------------------------------------------------------------


def nvfp4_inputs() -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    w = torch.from_numpy(known_values(64 * 48, 3).reshape(64, 48)) * 2.0 ** -26
    w[5, 16:32] = 0  # an all-zero block: scale 1
    ragged = torch.from_numpy(known_values(8 * 40, 4).reshape(8, 40)) * 2.0 ** -22  # 40 columns: padded to 48
    return {"matrix": (w.bfloat16(), None), "ragged": (ragged, None), "shared": (w.bfloat16(), torch.tensor(0.3))}


# ModelOpt's NVFP4QTensor.quantize / dequantize on nvfp4_inputs() (its source run here): sha256 of the packed codes and
# of the e4m3 weight_scale bytes, weight_scale_2 exactly, sha256 of the served values (cropped to the columns).
MODELOPT = {
    "matrix": ("21f8771bd8cf205110ced4f5d99a53ab748d9d54f67de32948600c5eddf87c50",
               "7b80ceeb22d6c8781d295726bc2d7568a63896dd46b93e8712f3b9cbbe26017d", "0x1.8618620000000p-15",
               "53a17d4707f3a368411e975f931ab687348fdb630e07a2c5cdbd28489e71ae37"),
    "ragged": ("f11964ec6bad288e91e323eabde15d096d07a9ac5e163110902d5c26c6356410",
               "06d3f4127c480e33693929150676c7033cae4bf3089249df60f0f8b67b5e4b09", "0x1.82a1240000000p-11",
               "70c2604e4371ae1871a5935d23dc0f64d363a2ab509ae56108158ed5a6d10764"),
    "shared": ("11034af52defcf50ba7e460802cb6b5055ed080b6c0a900e57851ac8a04cd95c",
               "58b87d54421108464e4a784dadb4144a07ad9f66b406bcc63193f32e48edd827", "0x1.d41d440000000p-14",
               "c13391669fbfab7bba233429ef82b47f62912b72ee609baf564f33e3cff1319a"),
}


@pytest.mark.parametrize("case", list(MODELOPT))
def test_nvfp4_is_modelopts_export_bit_for_bit(case):
    w, shared = nvfp4_inputs()[case]
    packed, scale, scale_2 = Q.nvfp4_quantise(w, shared)
    values = Q.nvfp4_dequantise(packed, scale, scale_2, columns=w.shape[-1])
    assert (digest(packed), digest(scale.view(torch.uint8)), float(scale_2).hex(), digest(values)) == MODELOPT[case]
    assert torch.equal(Q.round_trip(w, "nvfp4", shared), values)


def test_nvfp4_rounds_ties_to_the_even_code_and_an_all_zero_tensor_serves_zeros():
    # block amax 6 -> weight_scale_2 = 6 / 2688, block scale e4m3(448): the values land on E2M1's grid and midpoints
    ties = torch.tensor([[6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, 0.0]])
    packed, scale, _ = Q.nvfp4_quantise(ties)
    assert packed.tolist() == [[7, 34, 68, 102, 168, 202, 236, 14]] and scale.float().tolist() == [[448.0]]
    assert Q.round_trip(ties, "nvfp4").tolist() == [[6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 0.0, -1.0, -1.0, -2.0, -2.0,
                                                      -4.0, -4.0, 0.0]]
    assert torch.equal(Q.round_trip(torch.zeros(4, 32), "nvfp4"), torch.zeros(4, 32))


# --- block-FP8 and INT8 ------------------------------------------------------------------------------


def test_fp8_blocks_are_the_fp8_writers_and_read_back_through_the_fp8_loader_including_ragged_and_zero_blocks():
    w = torch.from_numpy(known_values(130 * 200, 5).reshape(130, 200)) * 2.0 ** -28  # blocks 128 + 2 rows, 128 + 72 cols
    w[:128, :128] = 0  # an all-zero block
    w = w.bfloat16().float()
    codes, scale = Q.fp8_block_quantise(w)
    assert scale.shape == (2, 2) and scale.dtype == torch.float32 and float(scale[0, 0]) == 0.0
    q, s = quantize_fp8_blockwise(w)  # what synthetic.write_fp8_copy stores, read back by checkpoint.py
    assert torch.equal(codes.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(Q.round_trip(w, "fp8_block"), dequantize_blockwise(q, s, (128, 128)))
    assert torch.equal(Q.round_trip(w, "fp8_block")[:128, :128], torch.zeros(128, 128))
    assert torch.equal(scale[1:, 1:], w[128:, 128:].abs().amax().reshape(1, 1) / 448.0)


def test_an_fp8_block_on_a_worked_example_scales_by_amax_over_448():
    w = torch.tensor([[1.0, -2.0], [0.5, 448.0]])  # amax 448: scale 1, every value exact in e4m3
    codes, scale = Q.fp8_block_quantise(w, (2, 2))
    assert scale.tolist() == [[1.0]] and codes.float().tolist() == w.tolist()
    w = torch.tensor([[3.0, 0.1]])  # amax 3: scale 3/448; 0.1 * 448/3 = 14.93 -> e4m3 15.0 -> 15 * 3/448 = 0.10045
    assert Q.fp8_block_dequantise(*Q.fp8_block_quantise(w, (2, 2)), (2, 2))[0, 1].item() == pytest.approx(15 * 3 / 448, rel=1e-7)


def test_int8_per_channel_is_compressed_tensors_rule_on_a_worked_row():
    row = torch.tensor([[-127.5, 63.5, 62.5, 0.5, -0.5, 1.5, 0.0, 127.5]])  # amax 127.5: scale 1 exactly
    codes, scale = Q.int8_channel_quantise(row)
    assert scale.tolist() == [[1.0]]
    assert codes.tolist() == [[-128, 64, 62, 0, 0, 2, 0, 127]]  # half to even; clamped to [-128, 127]
    two = torch.tensor([[2.55, -1.0], [0.0, 0.0]])  # the zero row: scale eps, codes 0, served 0
    assert Q.round_trip(two, "int8_channel")[1].tolist() == [0.0, 0.0]
    assert Q.int8_channel_quantise(two)[1][0].item() == pytest.approx(2.55 / 127.5)


def test_stored_bytes_are_each_formats_block_sizes():
    assert Q.stored_bytes((64, 512), "q8_0") == 64 * 16 * 34
    assert Q.stored_bytes((64, 512), "q6_k") == 64 * 2 * 210
    assert Q.stored_bytes((64, 512), "q4_k") == 64 * 2 * 144
    assert Q.stored_bytes((64, 512), "q5_0") == 64 * 16 * 22
    assert Q.stored_bytes((130, 200), "fp8_block") == 130 * 200 + 4 * 4
    assert Q.stored_bytes((8, 40), "nvfp4") == 8 * (24 + 3) + 4
    assert Q.stored_bytes((8, 40), "int8_channel") == 8 * 40 + 8 * 2
    assert Q.stored_bytes((8, 40), "bf16") == 8 * 40 * 2
