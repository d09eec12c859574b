"""(b) The CPU stand-in of the rejection sampler's expand kernel never writes its output.

vLLM's rejection sampler expands each request's temperature, top-k and top-p to one value per draft token
(`expand_batch_to_tokens`, vllm/v1/sample/rejection_sampler.py:581-618: `new_empty`, then the expand kernel fills
it). Without Triton the CPU platform swaps the kernel for `vllm.utils.cpu_triton_utils._expand_kernel_impl`
(vllm/platforms/cpu.py:711-713), which hands `torch.ops._C.expand_kernel_impl` an int64 *copy* of the output
whenever the output is not int64 (vllm/utils/cpu_triton_utils.py:390-404): the float32 temperature and top-p and
the int32 top-k tensors are never written (and a float written through int64 would be truncated). Every sampled
speculative step then divides the logits by uninitialised memory (rejection_sampler.py:550-578). Greedy batches
return before the expansion and are unaffected.

The fix is a stand-in that writes the output tensor itself, in its own dtype: out[start_i : end_i] = x_i, with
x_i == replace_from replaced by replace_to, the kernel's contract (rejection_sampler.py `expand_kernel`).
"""

from __future__ import annotations

import torch


def expand_into(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803
    """output[num_tokens] <- input_val[batch] repeated by the counts cu_num_tokens[batch] (cumulative) gives."""
    ends = cu_num_tokens.to(torch.long)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    if MAX_NUM_TOKENS is not None:  # the kernel writes at most MAX_NUM_TOKENS per request
        counts = counts.clamp(max=int(MAX_NUM_TOKENS))
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    starts = ends - torch.diff(ends, prepend=ends.new_zeros(1))
    positions = torch.repeat_interleave(starts, counts) + _ranks(counts)
    output[positions] = torch.repeat_interleave(values, counts).to(output.dtype)


def _ranks(counts: torch.Tensor) -> torch.Tensor:
    """[0, 1, .., c0-1, 0, 1, .., c1-1, ...] for counts [c0, c1, ...]."""
    total = int(counts.sum())
    firsts = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    return torch.arange(total, dtype=counts.dtype) - firsts


expand_into.mtp_observe_fix = "expand"


def apply() -> None:
    from vllm.utils import cpu_triton_utils

    cpu_triton_utils._expand_kernel_impl = expand_into
