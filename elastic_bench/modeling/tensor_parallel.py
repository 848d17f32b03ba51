"""Tensor parallelism: a model sharded over ranks by transformers' own tensor-parallel plan, each rank attending and
planning its own heads.

Design decisions:
- The sharding is transformers' (the model family's ``base_model_tp_plan``: query, key and value projections split by
  heads, the output projection by rows; DTensor under ``torchrun``), applied by `distribute`; nothing is sharded by
  hand. Data parallelism composes with it as transformers composes it: ``torchrun`` over ``tp × dp`` ranks, a mesh of
  ``dp`` replicas (``dp_replicate``) of ``tp`` ranks each; the ranks ``[d·tp, (d+1)·tp)`` form replica ``d``.
- Each rank's attention function receives the query and KV heads of its shard: KV heads ``[r·H/tp, (r+1)·H/tp)`` of
  rank ``r`` (`kv_heads`), and their query heads (`query_heads`). A method whose state is indexed by head (gates,
  per-head thresholds, router feature means) slices it with these; a method that plans from the call's tensors alone
  (streaming, XAttention's selection, the router's head-agnostic MLPs) needs nothing.
- What a run records is the single-process value: the sparsity tallies of the ranks are joined along the head axis
  before ΩMSR / ΩESR are computed (`join_heads`: the same per-head values, so the same means to the last bit), and
  KV-cache bytes are summed (`TensorParallel.sum`). Logits are replicated by the plan, so every rank of a replica
  generates the same tokens and no routing decision needs to be exchanged.
- User errors (a head count the ranks do not divide, a family without a plan, ``--tp`` outside ``torchrun``) are
  checked on the model's config (`check`), before any weights load.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

_TP = "_elastic_bench_tensor_parallel"  # the model's `TensorParallel`
_HEADS = "_elastic_bench_kv_heads"  # an attention module's KV-head slice


@dataclass(frozen=True)
class TensorParallel:
    """The tensor-parallel shard of this rank.

    Attributes:
        rank: this rank's index within its replica (0 … size − 1).
        size: ranks per replica (``--tp``).
        group: the process group of the replica's ranks (collectives of `gather` / `sum`).
    """

    rank: int
    size: int
    group: Any

    def gather(self, value: Any) -> list[Any]:
        """``value`` of every rank of the replica, in rank order (picklable values; tensors on the CPU)."""
        out: list[Any] = [None] * self.size
        torch.distributed.all_gather_object(out, value, group=self.group)
        return out

    def sum(self, values: tuple[int | None, ...]) -> tuple[int | None, ...]:
        """Element-wise sums of ``values`` over the replica's ranks (None stays None: every rank has the same Nones)."""
        gathered = self.gather(values)
        return tuple(None if v is None else sum(g[i] for g in gathered) for i, v in enumerate(values))


def check(config, tp: int, world_size: int) -> None:
    """Refuse a tensor-parallel run that cannot work, before any weights load.

    Args:
        config: the model's transformers config (`elastic_bench.modeling.loading.model_config`).
        tp: ranks per replica (``--tp``).
        world_size: processes of the run (``torchrun``'s ``WORLD_SIZE``; 1 outside it).

    Raises:
        ValueError: ``tp`` < 1, ``tp`` > 1 outside ``torchrun``, a world size ``tp`` does not divide, a query or KV head
            count ``tp`` does not divide, or a model family without a tensor-parallel plan (one line).
    """
    if tp < 1:
        raise ValueError(f"tp must be at least 1, got {tp}")
    if tp == 1:
        return
    if world_size == 1:
        raise ValueError(f"--tp {tp} needs torchrun: torchrun --nproc-per-node {tp} -m elastic_bench run --tp {tp} ...")
    if world_size % tp:
        raise ValueError(f"--tp {tp} does not divide the {world_size} torchrun processes (they must be tp × dp)")
    heads = {"query": config.num_attention_heads, "KV": config.num_key_value_heads}
    for kind, count in heads.items():
        if count % tp:
            raise ValueError(f"--tp {tp} does not divide the model's {count} {kind} heads")
    if not getattr(config, "base_model_tp_plan", None):
        raise ValueError(f"transformers has no tensor-parallel plan for model type {config.model_type!r}; run it "
                         "without --tp (--device-map auto places it over the GPUs of one host)")


def distributed_config(tp: int, world_size: int):
    """transformers' `DistributedConfig` of ``tp`` ranks per replica over ``world_size`` processes."""
    from transformers.distributed.configuration_utils import DistributedConfig

    replicas = world_size // tp
    return DistributedConfig(tp_size=tp, **({"dp_replicate_size": replicas} if replicas > 1 else {}))


def distribute(model: nn.Module, tp: int, world_size: int) -> nn.Module:
    """Shard a model built on every rank alike (the same seed) by its tensor-parallel plan; each rank keeps its own
    slice of each weight. A checkpoint loads sharded instead (`from_pretrained(distributed_config=...)`)."""
    config = distributed_config(tp, world_size)
    config, _, meshes = type(model).prepare_distribute_model(config)
    tied = model.all_tied_weights_keys
    for target in tied:  # sharded one by one, as a checkpoint loads them, and tied again after
        module, _, name = target.rpartition(".")
        setattr(model.get_submodule(module), name, nn.Parameter(model.get_parameter(target).detach().clone()))
    model = type(model).maybe_distribute_model(model, config, meshes)
    if tied:
        model.tie_weights()
    return model


def mark(model: nn.Module, tp: int, modules: list[nn.Module]) -> TensorParallel:
    """Ready a sharded ``model`` for inference and record on it and its attention ``modules`` (`elastic_bench.modeling.
    attention.attention_modules`) the shard this rank holds; returns it.

    With several replicas transformers wraps each in FSDP2 over the replica axis (nothing is sharded there, the
    weights are replicated): its modules are unsharded once and kept so, since FSDP2 cannot gather weights under
    ``torch.inference_mode``, which generation runs in."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.unshard()
            module.set_reshard_after_forward(False)
    mesh = model._mesh_manager.get_mesh("tp")
    shard = TensorParallel(mesh.get_local_rank(), tp, mesh.get_group())
    setattr(model, _TP, shard)
    for module in modules:
        per_rank = module.config.num_key_value_heads // tp
        setattr(module, _HEADS, slice(shard.rank * per_rank, (shard.rank + 1) * per_rank))
    return shard


def tensor_parallel(model: nn.Module) -> TensorParallel | None:
    """The shard of a model loaded with ``tp`` > 1 (`elastic_bench.modeling.loading.load_model`); None otherwise."""
    return getattr(model, _TP, None)


def kv_heads(module: nn.Module) -> slice:
    """The model's KV heads that this rank's attention ``module`` holds (all of them without tensor parallelism)."""
    return getattr(module, _HEADS, slice(0, module.config.num_key_value_heads))


def query_heads(module: nn.Module) -> slice:
    """The model's query heads that this rank's attention ``module`` holds: the query heads of its `kv_heads`."""
    heads = kv_heads(module)
    group = module.config.num_attention_heads // module.config.num_key_value_heads
    return slice(heads.start * group, heads.stop * group)


def join_heads(shard: TensorParallel, samples: list[dict[int, Any]]) -> list[dict[int, Any]]:
    """This rank's per-sample sparsity tallies (`elastic_bench.kernels.SparsityMeter.samples`: sample → layer → tally
    of its KV heads) joined with the other ranks' along the head axis: what one process holding every head would have
    recorded. Every rank of the replica calls it (a collective)."""
    fields = ("modes", "attended", "attended_last")  # the per-head tensors of a tally
    mine = [{layer: dataclasses.replace(t, **{f: getattr(t, f).cpu() for f in fields}) for layer, t in s.items()}
            for s in samples]
    joined = []
    for per_rank in zip(*shard.gather(mine)):
        joined.append({layer: dataclasses.replace(tally, **{f: torch.cat([getattr(r[layer], f) for r in per_rank])
                                                            for f in fields})
                       for layer, tally in per_rank[0].items()})
    return joined
