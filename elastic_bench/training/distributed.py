"""One process per GPU under ``torchrun``: rank, world size, device, and the few collectives the runner needs.

Outside ``torchrun`` (no ``WORLD_SIZE`` > 1 in the environment) everything degrades to a single process and no
process group is created. Under tensor parallelism (``tp`` > 1) the ranks form ``world_size / tp`` replicas of ``tp``
consecutive ranks, each replica holding one copy of the model: samples are shared out over replicas, and the first rank
of each writes its records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from elastic_bench.foundation.torchrun import torchrun_env


@dataclass(frozen=True)
class Ranks:
    """This process among the run's.

    Attributes:
        rank, world_size, local_rank: torchrun's.
        tp: ranks per model replica (tensor parallelism; 1: every rank holds a whole model).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    tp: int = 1

    @classmethod
    def from_env(cls, device: str | None = None, tp: int = 1) -> Ranks:
        """Read torchrun's environment and join the process group (NCCL on CUDA, gloo on the CPU); ``tp`` ranks hold
        each model replica (checked to divide the world by `elastic_bench.modeling.loading.check_placement`)."""
        rank, world, local_rank = torchrun_env()  # checked: one clear line for what torchrun would never set
        if world == 1:
            return cls()
        ranks = cls(rank, world, local_rank, tp)
        if not dist.is_initialized():
            use_cuda = torch.cuda.is_available() and (device is None or device.startswith("cuda"))
            if use_cuda:
                torch.cuda.set_device(ranks.local_rank)
            dist.init_process_group("nccl" if use_cuda else "gloo")
        return ranks

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def replica(self) -> int:
        """The index of this rank's model replica (data parallelism's rank)."""
        return self.rank // self.tp

    @property
    def replicas(self) -> int:
        """Model replicas of the run (data parallelism's world size)."""
        return self.world_size // self.tp

    @property
    def writes(self) -> bool:
        """Whether this rank writes its replica's records (the replica's first rank)."""
        return self.rank % self.tp == 0

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
