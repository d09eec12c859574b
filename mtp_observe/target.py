"""The target: chunked prefill through transformers' Qwen3.5, and the reductions of its logits.

Contract: `prefill_hidden` runs one request's tokens through the model's own cache in chunks
and returns the post-final-norm hidden state at every position — the tensor the lm_head
consumes and the one the MTP head pairs with the next token. Nothing vocabulary-sized is
kept here; logits are reduced chunk by chunk where rows need them.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor


def _cache_kwarg(text_model) -> str:
    """transformers renamed `past_key_values` to `cache`; use whichever this version takes."""
    params = inspect.signature(text_model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@torch.no_grad()
def prefill_hidden(model, input_ids: Tensor, chunk_size: int = 2048) -> Tensor:
    """input_ids: [n] -> h: [n, H], post-final-norm, computed chunk by chunk through the model's cache.

    Chunk boundaries may fall anywhere: the full-attention layers keep their KV in the cache and
    the linear-attention layers their conv and recurrent states, so chunked == whole.
    """
    from transformers import DynamicCache

    text_model = model.model
    device = text_model.embed_tokens.weight.device
    n = input_ids.shape[0]
    hidden = torch.empty(n, model.config.hidden_size, dtype=text_model.embed_tokens.weight.dtype, device=device)
    cache = DynamicCache(config=model.config)
    kw = _cache_kwarg(text_model)
    for c0 in range(0, n, chunk_size):
        c1 = min(n, c0 + chunk_size)
        chunk = input_ids[c0:c1].to(device)[None]
        out = text_model(input_ids=chunk, use_cache=True, **{kw: cache})
        hidden[c0:c1] = out.last_hidden_state[0]
    return hidden
