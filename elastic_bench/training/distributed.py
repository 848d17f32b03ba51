"""One process per GPU under ``torchrun``: rank, world size, device, and the few collectives the runner needs.

Outside ``torchrun`` (no ``WORLD_SIZE`` > 1 in the environment) everything degrades to a single process and no
process group is created.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls, device: str | None = None) -> Ranks:
        """Read torchrun's environment and join the process group (NCCL on CUDA, gloo on the CPU)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return cls()
        ranks = cls(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
        if not dist.is_initialized():
            use_cuda = torch.cuda.is_available() and (device is None or device.startswith("cuda"))
            if use_cuda:
                torch.cuda.set_device(ranks.local_rank)
            dist.init_process_group("nccl" if use_cuda else "gloo")
        return ranks

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, requested: str | None) -> str | None:
        """The device of this rank: ``cuda:<local_rank>`` when several ranks share CUDA, else ``requested``."""
        if self.world_size > 1 and torch.cuda.is_available() and (requested is None or requested == "cuda"):
            return f"cuda:{self.local_rank}"
        return requested

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def gather(self, value: Any) -> list[Any]:
        """``value`` of every rank, in rank order (a list of one outside torchrun)."""
        if self.world_size == 1:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out
