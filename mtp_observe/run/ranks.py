"""The ranks: this process's place in a torchrun job, and what crosses between ranks.

Contract: `ranks_from_env(device)` joins the torchrun job when WORLD_SIZE > 1 (gloo on CPU, nccl on CUDA) and
returns a `Ranks`; `Ranks.owns(i)` deals sessions round-robin by input index; `gather` and `from_rank0` move
Python objects between ranks; `portable(e)` makes an exception another rank can unpickle and raise. Nothing here
knows what a session or a run directory is; the pipeline decides what each rank replays and rank 0 writes the
manifest (manifest.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Ranks:
    """This process's place in a torchrun job (rank 0 of 1 without one). Sessions are dealt round-robin."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    def owns(self, session_index: int) -> bool:
        return session_index % self.world == self.rank

    def gather(self, obj) -> list:
        """Every rank's obj, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def from_rank0(self, obj):
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def ranks_from_env(device: str) -> Ranks:
    """Join the torchrun job if there is one (WORLD_SIZE > 1): gloo on CPU, nccl on CUDA."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Ranks()
    import datetime

    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(hours=6))
    return Ranks(rank=dist.get_rank(), world=dist.get_world_size(), local_rank=int(os.environ.get("LOCAL_RANK", "0")))


def portable(e: BaseException) -> BaseException:
    """An exception another rank can unpickle and raise: user errors as they are, anything else summarised."""
    from ..errors import UserError

    if isinstance(e, UserError):
        return type(e)(str(e)) if type(e).__init__ is UserError.__init__ else UserError(str(e))
    return RuntimeError(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
