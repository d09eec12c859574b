"""A vLLM worker extension handing out the target's last hidden state (post final norm) at every prompt position.

    python -m vllm.entrypoints.openai.api_server --model DIR --no-enable-prefix-caching \
        --worker-extension-cls mtp_observe_vllm_fixes.capture.HiddenStateCapture   (VLLM_SERVER_DEV_MODE=1)

vLLM binds this class's methods onto its worker (vllm/v1/worker/worker_base.py:296-320); the dev-mode route
POST /collective_rpc (vllm/entrypoints/serve/dev/rpc/api_router.py:23-57, mounted when VLLM_SERVER_DEV_MODE=1:
vllm/entrypoints/launchers/api_server/routers.py:40-43) calls them on every worker with string arguments.

What is captured: a forward hook on the worker's top-level model module. Its output is what the model's forward
returns, the hidden state after the final norm: Qwen3.5's language model is Qwen3NextModel, whose forward ends in
`hidden_states, _ = self.norm(hidden_states, residual)` and returns it (vllm/model_executor/models/qwen3_next.py:739,
:754) through Qwen3_5ForCausalLM.forward (qwen3_5.py:373-385). The hook is outside the compiled region (vLLM compiles
the inner model's forward), so it sees the tensor the lm_head is applied to.

Protocol (one client at a time; the engine serves no other traffic while a replay reads it):
  mtp_observe_capture_reset()      start capturing (installing the hook once), drop anything captured
  <one completion: the prompt's token ids, max_tokens 1>  every forward of the prefill appends its rows
  mtp_observe_capture_take(NAME)   write the captured rows to $MTP_OBSERVE_CAPTURE_DIR/NAME.safetensors
                                   ("hidden_states" [n, H] in the model's dtype) and drop them; returns
                                   {"path", "tokens", "hidden_size", "dtype", "normed": true, "forwards"}
Only the worker holding the final norm (the last pipeline stage) at tensor-parallel rank 0 writes; the others
return None.
"""

from __future__ import annotations

import os
import re

CAPTURE_DIR_ENV = "MTP_OBSERVE_CAPTURE_DIR"


class HiddenStateCapture:
    """Mixed into vLLM's worker (worker_extension_cls); `self.model_runner` is the worker's."""

    def _mtp_observe_writer(self) -> bool:
        from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

        return get_pp_group().is_last_rank and get_tensor_model_parallel_rank() == 0

    def mtp_observe_capture_reset(self) -> dict:
        model = self.model_runner.model
        if not hasattr(self, "_mtp_observe_rows"):
            self._mtp_observe_rows = []

            def hook(module, args, output):
                states = output[0] if isinstance(output, tuple) else output
                if hasattr(states, "shape") and states.dim() == 2:
                    self._mtp_observe_rows.append(_real_rows(states).detach().to("cpu", copy=True))

            model.register_forward_hook(hook)
        self._mtp_observe_rows.clear()
        return {"model": type(model).__name__}

    def mtp_observe_capture_take(self, name: str) -> dict | None:
        import torch
        from safetensors.torch import save_file

        rows, self._mtp_observe_rows[:] = list(self._mtp_observe_rows), []
        if not self._mtp_observe_writer():
            return None
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", name):
            raise ValueError(f"capture name {name!r}: letters, digits, '_', '.', '-' only")
        folder = os.environ.get(CAPTURE_DIR_ENV)
        if not folder:
            raise ValueError(f"set {CAPTURE_DIR_ENV} on the server: the folder (shared with the client) it writes to")
        hidden = torch.cat(rows) if rows else torch.empty(0, 0)
        path = os.path.join(folder, name + ".safetensors")
        save_file({"hidden_states": hidden.contiguous()}, path + ".part")
        os.replace(path + ".part", path)
        return {"path": path, "tokens": int(hidden.shape[0]), "hidden_size": int(hidden.shape[-1]),
                "dtype": str(hidden.dtype).removeprefix("torch."), "normed": True, "forwards": len(rows)}


def _real_rows(states):
    """The forward's real rows: its output is padded past them where the forward context's is_padding mask says so
    (vllm/forward_context.py:162-165)."""
    try:
        from vllm.forward_context import get_forward_context

        padding = get_forward_context().is_padding
    except (AssertionError, AttributeError):  # outside a forward context nothing is padded
        return states
    if padding is None or padding.shape[0] != states.shape[0]:
        return states
    return states[~padding.to(states.device)]
