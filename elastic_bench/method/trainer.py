"""Router training: frozen backbone, trainable routers and Lagrange multipliers; one process or ``torchrun`` + FSDP2.

Paper: https://arxiv.org/abs/2601.17367 §3.2-3.3, Eq. 8, App. D.1 (hyper-parameters). The loop, the resumable
training state, the log and the packed-row data path are the training engine's (`elastic_bench.training.engine`),
which also declares how a run executes (`RunOptions`); this module is the router objective on top of it.

Design decisions:
- Only the routers and λ train. The backbone's parameters have ``requires_grad=False`` and are never written.
- Each optimizer step takes ``rows_per_step`` packed rows (the global batch). Row order and Gumbel noise are pure
  functions of (seed, step, row slot), so ``N`` ranks with ``rows_per_step / N`` rows each compute exactly the
  gradients one process computes on the same step: the loss of each row is divided by ``rows_per_step`` and the
  router/λ gradients are summed over ranks (one all-reduce).
- Under ``torchrun`` the backbone is sharded with FSDP2 (``fully_shard`` per decoder layer and on the loss wrapper)
  and the routers, held by the method outside the model, stay replicated.
- Each row's forward gets its own `TrainingRoute` (temperature, noise, prompt lengths) as the ``training_route``
  keyword; the `Elastic` method records the straight-through decisions into it, which give the row's ΩMSR.
- Loss of a row: mean token cross-entropy (`LossModel`: 2048-token chunks, each recomputed in backward, so no full
  ``[T, vocab]`` logits are kept) plus the per-category Lagrangian of `sparsity_penalty`.
- AdamW (0.9, 0.95), router lr 5e-4 with weight decay 0.1, λ lr 1e-3 ascending (``maximize=True``) without weight
  decay, linear warm-up over 20% of the steps then cosine decay, gradient-norm clip 5.0 over routers and λ.
- bf16 autocast on CUDA; optional gradient checkpointing of the decoder layers.
- Output directory: ``router.safetensors`` + ``router_config.json`` (rewritten at every checkpoint), ``train_log.jsonl``
  (one line per step) and the engine's training state (``train_state.safetensors`` + ``train_state.json``).
  Re-running the same command resumes from the last checkpoint (a complete run is only evaluated again); a different
  configuration in the same directory is an error.
- The final evaluation (hard ΩMSR per category with argmax routing on prompts of the training data) runs without
  gradients on the fastest inference backend.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from elastic_bench.foundation.files import exclusive
from elastic_bench.kernels import torch_dtype
from elastic_bench.training.distributed import Ranks
from elastic_bench.training.engine import (
    LossModel,
    Objective,
    PackedRow,
    RunOptions,
    autocast,
    enable_gradient_checkpointing,
    fingerprint,
    fit,
    in_range,
    pack,
    replica_divergence,
    row_inputs,
    shard,
    training_backend,
)
from elastic_bench.training.engine import all_reduce_sum as _all_reduce_sum
from elastic_bench.training.engine import tokenize as tokenize_examples
from elastic_bench.training.provenance import epoch_tokens, learned_provenance

from .checkpoint import RouterBank, RouterConfig, save_routers
from .data import (
    DEFAULT_TARGETS,
    check_categories,
    check_targets,
    data_provenance_of,
    locate,
    read_data,
    record_task,
    synthetic_records,
    to_example,
)
from .modes import ModeConfig
from .objective import LagrangeMultipliers, omega_msr, sparsity_penalty
from .relaxation import gumbel_noise, temperature
from .step_cost import StepCost


@dataclass
class RouterTrainConfig:
    """What router training learns (defaults: the paper's App. D.1 and the official training's values); how a run
    executes is `RunOptions`.

    Attributes:
        model: base model spec (``tiny:qwen3``, ``testbed``, a path or hub id); frozen during training.
        data: training records (a JSONL/parquet file or a directory of them, `elastic_bench.method.data`),
            ``"records"`` (the records ``elastic-bench records --model MODEL --seed SEED`` writes, made in the
            process: the paper's five task labels at lengths spread over the model's context, from sources no
            benchmark uses, `router_records`), ``"synthetic"`` (`synthetic_records`, a small set for quick runs), or
            the paper's mixture by name, ``LCM_group/qwen_mix_sft_64K6`` or ``LCM_group/llama_mix_sft_64K6`` (its
            parquet files under ``data_dir``, else from the Hugging Face hub).
        data_dir: folder holding the official mixture as ``<name>/*.parquet`` (e.g.
            ``DATA/LCM_group/qwen_mix_sft_64K6/``); None: ``$ELASTIC_BENCH_DATA``.
        steps: optimizer steps.
        rows_per_step: packed rows per optimizer step, over all ranks (a multiple of the number of ranks); 24 as the
            official script's global batch (6 accumulation steps × 8 GPUs, sequence parallelism 2).
        pack_tokens: tokens per packed row.
        max_tokens: per-sample cap in tokens; None: ``pack_tokens``.
        min_tokens: shortest sample kept under ``length_rule="drop"`` (the official packing: 1024).
        length_rule: samples outside ``min_tokens``-``max_tokens``: ``drop`` them (the official packing, which
            leaves out rows outside 1K-64K tokens) or ``truncate`` (cut the middle of a long one's prompt, keep the
            short ones).
        targets: target ΩMSR per category (``NAME=VALUE``); every category of the data needs one.
        attention: what the router's two sides mean (mode, streaming geometry, XAttention threshold).
        hidden_mult: hidden width of the router's MLPs, in multiples of the head dimension (4 in the paper).
        pooling: how the router pools a prompt's pre-RoPE keys: ``"boundary"`` (its first and last keys, the
            official inference) or ``"mean"`` (all of them).
        center_features: subtract from the router's pooled keys a fixed per-(layer, KV head) mean, the category-balanced
            mean over the evaluation prompts with full attention, computed once before step 1 (`feature_means`).
        relaxation: ``"softmax"`` (2 logits per head, Gumbel-softmax: the paper's main setting and the released
            checkpoints) or ``"sigmoid"`` (1 logit per head, Gumbel-sigmoid of App. F).
        train_pooling: pooling in training if it differs from ``pooling`` (``"mean"``: the official training's
            whole-prompt mean); None: ``pooling``.
        router_lr: peak AdamW learning rate of the routers.
        lambda_lr: peak learning rate of the Lagrange multipliers λ (gradient ascent).
        weight_decay: AdamW weight decay of the routers.
        lambda_weight_decay: AdamW weight decay of λ.
        betas: AdamW ``(β1, β2)`` of routers and λ.
        grad_clip: clip of the total gradient norm over routers and λ.
        warmup: fraction of the steps of linear learning-rate warm-up (then cosine decay, `lr_factor`).
        min_lr_ratio: learning rate at the end of the cosine decay, as a fraction of the peak.
        tau_schedule: Gumbel temperature schedule: ``"exponential"`` (paper Eq. 14) or ``"cosine"`` (official;
            `temperature`).
        tau_init: Gumbel temperature at step 0.
        tau_min: lowest Gumbel temperature.
        tau_rate: decay rate of the ``"exponential"`` schedule.
        penalty: form of the Lagrangian's linear term: ``"signed"`` (paper Eq. 8, ``λ1·(Ω − t)``) or ``"abs"``
            (official, ``λ1·|Ω − t|``).
        t_interval: ``(lo, hi)``: the constraint gap is the distance to ``[t + lo, t + hi]`` (0 inside) instead of
            ``Ω − t``; None: no tolerance.
        loss_tokens: the LM loss is taken on ``"all"`` next tokens inside a sample (the official training code,
            where the paper is silent) or on the ``"answer"`` tokens (the loss then measures what routing costs the
            task).
        synthetic_samples: number of records of the synthetic data set (``data="synthetic"``).
        synthetic_length: prompt length in characters of each synthetic record.
        backend: differentiable attention backend (``reference`` or ``flex``); None: ``reference`` on CPU, ``flex``
            on CUDA.
        gradient_checkpointing: recompute the decoder layers in backward (less memory, one more forward).
        device: where the backbone runs; None: CUDA when available (one GPU per rank under ``torchrun``).
        dtype: the backbone's dtype (``bfloat16``, ``float16``, ``float32``); None: bf16 on CUDA, fp32 on CPU.
        seed: router initialisation, λ initialisation, row order and Gumbel noise.
        eval_samples: prompts per category for the final hard-ΩMSR evaluation, evenly spaced over the category's
            samples in data order (`spread`: the records of every length).
    """

    model: str = "tiny:qwen3"
    data: str = "records"
    data_dir: str | None = None
    steps: int = 300
    rows_per_step: int = 24
    pack_tokens: int = 65536
    max_tokens: int | None = None
    min_tokens: int = 0
    length_rule: Literal["drop", "truncate"] = "drop"
    targets: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TARGETS))
    attention: ModeConfig = field(default_factory=ModeConfig)
    hidden_mult: int = 4
    pooling: str = "boundary"
    relaxation: str = "softmax"
    train_pooling: str | None = None
    center_features: bool = False
    router_lr: float = 5e-4
    lambda_lr: float = 1e-3
    weight_decay: float = 0.1
    lambda_weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 5.0
    warmup: float = 0.2
    min_lr_ratio: float = 1e-7
    tau_schedule: str = "exponential"
    tau_init: float = 1.5
    tau_min: float = 1.0
    tau_rate: float = 0.6
    penalty: str = "signed"
    t_interval: tuple[float, float] | None = None
    loss_tokens: str = "all"
    synthetic_samples: int = 256
    synthetic_length: int = 400
    backend: str | None = None
    gradient_checkpointing: bool = False
    device: str | None = None
    dtype: str | None = None
    seed: int = 0
    eval_samples: int = 16

    def __post_init__(self):
        if isinstance(self.attention, dict):
            self.attention = ModeConfig(**self.attention)
        self.betas = tuple(self.betas)
        self.t_interval = tuple(self.t_interval) if self.t_interval is not None else None
        torch_dtype(self.dtype)  # a ValueError naming the dtypes for any other name
        checks = {
            "steps must be >= 1": self.steps >= 1,
            "rows_per_step must be >= 1": self.rows_per_step >= 1,
            "pack_tokens must be >= 2": self.pack_tokens >= 2,
            "targets must lie in [0, 1]": all(0.0 <= t <= 1.0 for t in self.targets.values()),
            "warmup must lie in [0, 1)": 0.0 <= self.warmup < 1.0,
            "penalty must be 'signed' or 'abs'": self.penalty in ("signed", "abs"),
            "loss_tokens must be 'all' or 'answer'": self.loss_tokens in ("all", "answer"),
            "length_rule must be 'drop' or 'truncate'": self.length_rule in ("drop", "truncate"),
            "min_tokens must be >= 0": self.min_tokens >= 0,
            "tau_schedule must be 'exponential' or 'cosine'": self.tau_schedule in ("exponential", "cosine"),
            "pooling must be 'boundary' or 'mean'": self.pooling in ("boundary", "mean"),
            "relaxation must be 'softmax' or 'sigmoid'": self.relaxation in ("softmax", "sigmoid"),
            "train_pooling must be 'boundary', 'mean' or None": self.train_pooling in (None, "boundary", "mean"),
            "seed must be >= 0": self.seed >= 0,
        }
        failed = [message for message, ok in checks.items() if not ok]
        if failed:
            raise ValueError("; ".join(failed))
        if not self.targets:
            raise ValueError("targets must name at least one category")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "attention": self.attention.to_dict()}


@dataclass
class TrainResult:
    """What `train` returns: the trained routers, λ, the per-step log and the final hard ΩMSR per category (empty
    when the run stopped on its time limit before the last step)."""

    routers: RouterBank
    lambdas: dict[str, tuple[float, float]]
    log: list[dict[str, Any]]
    final_omega: dict[str, float]


def train(
    config: RouterTrainConfig, options: RunOptions, loaded: tuple[nn.Module, Any] | None = None
) -> TrainResult:
    """Train routers as configured into ``options.output``; resumes from it when it holds a run of the same
    configuration.

    Args:
        config: what is learned.
        options: how the run executes (folder, checkpoint interval, time limit: when it is up, the final evaluation
            does not run; progress bar on rank 0).
        loaded: an already loaded ``(model, tokenizer)`` of ``config.model`` to use instead of loading it (single
            process); its parameters are frozen in place and never modified.

    The output folder is locked for the run (`elastic_bench.foundation.files.exclusive`).
    """
    source = locate(config.data, config.data_dir)  # before the model loads
    records = None if source[1] is None else read_data(*source)  # a file or the official mixture, read once
    check_targets(data_categories(config, records), config.targets)  # a misspelt --target, before the model loads
    ranks = Ranks.from_env(config.device)
    with exclusive(options.output, "elastic-bench train-router", enabled=ranks.is_main):
        return _train(config, options, loaded, ranks, source, records)


def data_categories(config: RouterTrainConfig, records: list[dict[str, Any]] | None) -> set[str]:
    """The categories of the training data ``config.data``, known without a model: those of the records a model's
    own data holds (``records``), of the synthetic set, or of the ``records`` read from a file or the official
    mixture."""
    from elastic_bench.training.make_records import CATEGORIES

    if config.data == "records":
        return set(CATEGORIES)
    if config.data == "synthetic":
        return {r["category"] for r in synthetic_records(2, 1, config.seed)}
    return {to_example(r, f"{config.data} record {i + 1}").category for i, r in enumerate(records)}


def _train(config: RouterTrainConfig, options: RunOptions, loaded: tuple[nn.Module, Any] | None, ranks: Ranks,
           source: tuple[str, Path | None], records: list[dict[str, Any]] | None) -> TrainResult:
    from elastic_bench.modeling.attention import apply
    from elastic_bench.modeling.layer_kinds import layer_kinds
    from elastic_bench.modeling.loading import load_model

    from .elastic import Elastic, layer_ids, model_layout, routed_layers

    if loaded is not None and ranks.world_size > 1:
        raise ValueError("a preloaded model cannot be trained under torchrun; pass the model spec in the config")
    model, tokenizer = loaded or load_model(config.model, dtype=torch_dtype(config.dtype),
                                            device=ranks.device(config.device))
    device = next(model.parameters()).device
    backend = training_backend(config.backend, device)
    if config.rows_per_step % ranks.world_size:
        raise ValueError(f"rows_per_step={config.rows_per_step} is not a multiple of the {ranks.world_size} ranks")
    model.requires_grad_(False)
    if config.gradient_checkpointing:
        enable_gradient_checkpointing(model)

    recurrent = any(kind.kind == "linear" for kind in layer_kinds(model.config))
    categories, rows, eval_rows, data, read = _data(config, tokenizer, options.progress and ranks.is_main, source,
                                                    records, alone=recurrent)
    if ranks.is_main:
        print(read)
    layers, kv_heads, head_dim = model_layout(model)
    gen = torch.Generator().manual_seed(config.seed)
    bank = RouterConfig(
        layers, kv_heads, head_dim, layer_ids=layer_ids(routed_layers(model)), base_model=config.model,
        hidden_mult=config.hidden_mult, pooling=config.pooling,
        num_logits=2 if config.relaxation == "softmax" else 1, attention=config.attention,
        center_features=config.center_features,
    ).build()
    for router in bank.layers:
        router.reset_parameters(gen)
    if config.center_features:  # a resumed run overwrites it with the saved one
        feature_means(model, bank, eval_rows, len(categories), device, options.progress and ranks.is_main)
    lambdas = LagrangeMultipliers(len(categories), gen)
    bank.to(device)
    lambdas.to(device)

    method = Elastic()
    method.routers = bank
    cost = StepCost.of(model, layers, config.attention.geometry, config.attention.block_size,
                       config.gradient_checkpointing)  # before sharding
    loss_model = LossModel(model)
    if ranks.world_size > 1:
        shard(loss_model, model, device)
    objective = RouterObjective(config, options.output, bank, lambdas, loss_model, rows, categories,
                                (layers, kv_heads), device, ranks, data, cost)
    with apply(method, model, backend=backend) as handle:
        objective.handle = handle
        run = fit(objective, options, config.steps, fingerprint(config.to_dict()), ranks, desc="train-router")
    trainable = list(objective.replicated)
    replica_diff = replica_divergence(trainable, ranks)
    if replica_diff:
        raise RuntimeError(f"router replicas diverged across ranks (max abs difference {replica_diff:.3g})")
    final: dict[str, float] = {}
    if run.complete:
        # Evaluation needs no gradient: the fastest inference backend (a compiled one would recompile per prompt
        # length).
        with apply(method, model, backend="auto") as handle:
            final = evaluate_routing(handle, loss_model, eval_rows, categories, device,
                                     options.progress and ranks.is_main)
        if ranks.is_main:
            objective.export(config.steps, final, replica_diff if ranks.world_size > 1 else None)
    table = lambdas.table(categories)
    result_lambdas = {c: (table["lambda1"][c], table["lambda2"][c]) for c in categories}
    ranks.barrier()
    return TrainResult(bank, result_lambdas, run.log, final)


class RouterObjective(Objective):
    """The router objective on the engine: per micro-batch (one packed row of N samples) the row's mean token
    cross-entropy plus the per-category Lagrangian on its samples' ΩMSR, divided by ``rows_per_step``.

    Args:
        config: what is learned.
        output: the run's folder, where the routers are exported.
        bank, lambdas: the routers and λ (trained; replicated over ranks).
        loss_model: the frozen backbone with its loss (`LossModel`, FSDP2-sharded under ``torchrun``).
        rows: the packed training rows.
        categories: the category names (index order of ``PackedRow.categories``).
        layout: (layers, KV heads) of the backbone.
        device: the backbone's device.
        ranks: this process among the ranks.
        data: the ``data`` block of the routers' provenance (`elastic_bench.method.data.data_provenance_of`).
        cost: the FLOPs of a row (`StepCost`), logged per step beside its seconds.

    ``handle`` (the `elastic_bench.modeling.attention.apply` handle of the `Elastic` method) is set before `fit` runs.
    """

    def __init__(self, config: RouterTrainConfig, output: str, bank: RouterBank, lambdas: LagrangeMultipliers,
                 loss_model: LossModel, rows: list[PackedRow], categories: list[str], layout: tuple[int, int],
                 device: torch.device, ranks: Ranks, data: dict[str, Any], cost: StepCost):
        self.config, self.output, self.bank, self.lambdas, self.loss_model = config, output, bank, lambdas, loss_model
        self.cost = cost
        self.data = data
        self.categories, self.device, self.ranks = categories, device, ranks
        self.modules = {"routers": bank, "lambdas": lambdas}
        self.optimizer = torch.optim.AdamW(
            [
                {"params": list(bank.parameters()), "lr": config.router_lr, "weight_decay": config.weight_decay},
                {"params": list(lambdas.parameters()), "lr": config.lambda_lr,
                 "weight_decay": config.lambda_weight_decay, "maximize": True},
            ],
            betas=config.betas,
        )
        self.batches = RowBatches(config, rows, layout, ranks)
        self.replicated = self.clipped = list(bank.parameters()) + list(lambdas.parameters())
        self.grad_clip = config.grad_clip
        self.grad_norms = {"router": list(bank.parameters())}
        self.targets = torch.tensor([config.targets[c] for c in categories], device=device)
        self.handle = None

    def learning_rate(self, step: int) -> list[float]:
        """Peak rate of each group (routers, λ) times `lr_factor`."""
        factor = lr_factor(step, self.config)
        return [self.config.router_lr * factor, self.config.lambda_lr * factor]

    def losses(self, step: int, batch: list[tuple[PackedRow, torch.Tensor]]) -> Iterator[torch.Tensor]:
        """``batch``: this rank's (row, noise ``[N, L, H, 2]``) pairs of the step."""
        from .elastic import TrainingRoute

        config, k = self.config, len(self.categories)
        self.began = time.perf_counter()
        self.tau = tau = temperature(step, config.steps, config.tau_schedule, config.tau_init, config.tau_min,
                                     config.tau_rate)
        self.tally = tally = torch.zeros(3 + 2 * k, dtype=torch.float64)  # lm, penalty, rows, Ω sum/count
        self.tokens = sum(len(row.input_ids) for row, _ in batch)
        self.flops = sum(self.cost.row((row.cu_seqlens[1:] - row.cu_seqlens[:-1]).tolist()) for row, _ in batch)
        for row, noise in batch:
            self.handle.reset()
            route = TrainingRoute(tau, noise.to(self.device), row.prompt_lens, config.train_pooling)  # one copy
            with autocast(self.device):
                loss_sum, count = self.loss_model(*row_inputs(row, self.device), training_route=route)
            omega = omega_msr(route.stacked(self.bank.config.routed_layers))
            cats = row.categories.to(self.device)
            lm = loss_sum / count.clamp(min=1)
            penalty = sparsity_penalty(omega, cats, self.targets, self.lambdas, config.penalty, config.t_interval)
            yield (lm + penalty) / config.rows_per_step
            tally[0] += float(lm.detach())
            tally[1] += float(penalty.detach())
            tally[2] += 1
            hard = omega.detach().double().cpu()
            tally[3:3 + k].index_add_(0, row.categories, hard)
            tally[3 + k:].index_add_(0, row.categories, torch.ones_like(hard))

    def record(self, step: int, seconds: float) -> dict[str, Any]:
        k = len(self.categories)
        tally = torch.cat([self.tally, torch.tensor([float(self.tokens), self.flops], dtype=torch.float64)])
        if self.ranks.world_size > 1:
            tally = _all_reduce_sum(tally, self.device)
        rows = max(1.0, float(tally[2]))
        record = {
            "tau": round(self.tau, 6),
            "lr_router": self.optimizer.param_groups[0]["lr"],
            "lm_loss": float(tally[0]) / rows,
            "penalty": float(tally[1]) / rows,
            "omega_msr": {c: float(tally[3 + i] / tally[3 + k + i])
                          for i, c in enumerate(self.categories) if tally[3 + k + i]},
            **self.lambdas.table(self.categories),
            "seconds": time.perf_counter() - self.began,
            "tokens": int(tally[-2]),  # in the step's rows, over all ranks
            "flops": float(tally[-1]),  # of the step (`StepCost`): its ceiling is these at the device's peak
        }
        if self.device.type == "cuda":
            record["max_memory_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            if self.ranks.world_size > 1:
                record["max_memory_gib_per_rank"] = self.ranks.gather(record["max_memory_gib"])
        return record

    def postfix(self, record: dict[str, Any]) -> str:
        omega = " ".join(f"{c[:12]}={record['omega_msr'][c]:.2f}" for c in self.categories
                         if c in record["omega_msr"])
        return f"lm={record['lm_loss']:.3f} τ={record['tau']:.2f} Ω[{omega}]"

    def save(self, step: int) -> None:
        self.export(step)

    def export(self, step: int, final: dict[str, float] | None = None, replica_diff: float | None = None) -> None:
        """Write ``router.safetensors`` + ``router_config.json`` with the training record (configuration, steps done,
        λ, the data's provenance, `elastic_bench.training.provenance`; the final hard ΩMSR and the replicas' largest
        difference when given; versions, device and date)."""
        from elastic_bench.results.provenance import provenance

        self.bank.config.training = {
            **self.config.to_dict(),
            "steps_done": step,
            "categories": self.categories,
            **self.lambdas.table(self.categories),
            **({"final_omega_msr": final} if final is not None else {}),
            **({"replica_max_abs_diff": replica_diff} if replica_diff is not None else {}),
            "provenance": learned_provenance(self.data, step, self.batches.tokens_seen(step)),
            **provenance(next(self.bank.parameters()).device),
        }
        save_routers(self.bank, self.output)


class RowBatches(torch.utils.data.Dataset):
    """Item ``s``: this rank's micro-batches of step ``s``, ``[(row, noise [N, L, H, 2])]`` for the row slots
    ``rank, rank + world_size, …`` of ``rows_per_step`` (rows by `_row_index`, noise by `_noise_generator`)."""

    def __init__(self, config: RouterTrainConfig, rows: list[PackedRow], layout: tuple[int, int], ranks: Ranks):
        self.config, self.rows, self.layout, self.ranks = config, rows, layout, ranks

    def __len__(self) -> int:
        return self.config.steps

    def tokens_seen(self, steps: int) -> int:
        """The tokens of the rows of the first ``steps`` steps, over all ranks (in `_row_index`'s order)."""
        return epoch_tokens([len(row.input_ids) for row in self.rows], steps * self.config.rows_per_step,
                            lambda epoch: _row_order(len(self.rows), self.config.seed, epoch))

    def __getitem__(self, step: int) -> list[tuple[PackedRow, torch.Tensor]]:
        config, (layers, kv_heads) = self.config, self.layout
        out = []
        for slot in range(self.ranks.rank, config.rows_per_step, self.ranks.world_size):
            row = self.rows[_row_index(step, slot, len(self.rows), config)]
            noise = gumbel_noise((row.num_samples, layers, kv_heads, 2), _noise_generator(config.seed, step, slot))
            out.append((row, noise))
        return out


def feature_means(model: nn.Module, bank, rows: list[PackedRow], num_categories: int, device,
                  progress: bool = False) -> None:
    """Set each router's ``feature_mean [H, D]``: the mean over categories of the per-category mean pooled pre-RoPE key
    of the prompts of ``rows``, with full attention on every head (``progress``: a bar over the rows)."""
    from tqdm.auto import tqdm

    from elastic_bench.modeling.attention import apply
    from elastic_bench.modeling.interface import Method

    layers, heads, dim = len(bank.layers), bank.config.num_kv_heads, bank.config.head_dim
    sums = torch.zeros(num_categories, layers, heads, dim, dtype=torch.float64)
    counts = torch.zeros(num_categories, dtype=torch.float64)
    current: dict[str, Any] = {}

    class _Pool(Method):
        needs_pre_rope_keys = True

        def prefill_plan(self, call):
            pooled = bank[call.layer_idx].pool(call.pre_rope_keys).double().cpu()  # [1, H, D]
            sums[current["cat"][call.sample_ids[0]], bank.position[call.layer_idx]] += pooled[0]
            full = torch.ones(call.batch_size, call.num_kv_heads, dtype=torch.bool, device=call.query.device)
            return bank.config.attention.plan(full, call.query, call.key)

    loss_model = LossModel(model)
    with torch.no_grad(), autocast(device), apply(_Pool(), model, backend="auto"):
        for row in tqdm(rows, desc="feature means", unit="row", disable=not progress, file=sys.stderr):
            current["cat"] = row.categories.tolist()
            loss_model(*row_inputs(row, device)[:4], None)
            counts.index_add_(0, row.categories, torch.ones(row.num_samples, dtype=torch.float64))
    present = counts > 0
    mean = (sums[present] / counts[present][:, None, None, None]).mean(dim=0)
    for layer, router in enumerate(bank.layers):
        router.feature_mean.copy_(mean[layer].float())


def lr_factor(step: int, config: RouterTrainConfig) -> float:
    """Linear warm-up over ``warmup·steps`` steps, then cosine decay to ``min_lr_ratio``."""
    warm = math.ceil(config.warmup * config.steps)
    if step < warm:
        return (step + 1) / warm
    progress = (step - warm) / max(1, config.steps - warm)
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def evaluate_routing(handle, loss_model: LossModel, rows: list[PackedRow], categories: list[str], device,
                     progress: bool = False):
    """Mean hard ΩMSR per category with the deterministic (argmax) routers of ``handle``'s method on prompt-only
    rows (``progress``: a bar over the rows)."""
    from tqdm.auto import tqdm

    sums, counts = [0.0] * len(categories), [0] * len(categories)
    with torch.no_grad(), autocast(device):
        for row in tqdm(rows, desc="final evaluation", unit="row", disable=not progress, file=sys.stderr):
            handle.reset()
            loss_model(*row_inputs(row, device)[:4], None)
            for sample, cat in zip(handle.stats()["per_sample"], row.categories.tolist()):
                sums[cat] += sample["omega_msr"]
                counts[cat] += 1
    return {c: sums[i] / counts[i] for i, c in enumerate(categories) if counts[i]}


# ---- data ----------------------------------------------------------------------------------------------------------


def _data(config: RouterTrainConfig, tokenizer, progress: bool, source: tuple[str, Path | None],
          records: list[dict[str, Any]] | None, alone: bool = False
          ) -> tuple[list[str], list[PackedRow], list[PackedRow], dict[str, Any], str]:
    """The categories, the training rows and the rows of the final evaluation (prompts only) of the data that
    ``source`` names (`elastic_bench.method.data.locate`; ``records``: those read from its file or mixture, None for
    the data made here), the data block of its provenance and a line saying what was read; ``alone``: one sample per
    row (a model with linear-attention layers, whose recurrence would run on across packed samples)."""
    kind, path = source
    if kind == "records":
        records = model_records(config, tokenizer, progress)
    elif kind == "synthetic":
        records = synthetic_records(config.synthetic_samples, config.synthetic_length, config.seed)
    examples = [to_example(r, f"{config.data} record {i + 1}") for i, r in enumerate(records)]
    categories = check_categories(examples, config.targets)
    max_tokens = config.max_tokens or config.pack_tokens
    drop = config.length_rule == "drop"
    tokenized = tokenize_examples(examples, tokenizer, categories, max_tokens, progress, truncate=not drop)
    samples = in_range(tokenized, config.min_tokens, max_tokens, categories) if drop else tokenized
    kept = {id(s) for s in samples}
    trained = [r for r, s in zip(records, tokenized) if id(s) in kept]
    data = data_provenance_of(kind, path, trained, [len(s.input_ids) for s in samples])
    rows = _packed(samples, config, alone)
    picked: list = []
    for index in range(len(categories)):
        picked += spread([s for s in samples if s.category == index], config.eval_samples)
    prompts = [dataclasses.replace(s, input_ids=s.input_ids[: s.prompt_len]) for s in picked]
    tasks = Counter(record_task(r)[0] for r in trained)
    where = f"{kind} ({path})" if path is not None else kind
    read = (f"train-router data: {where}: {len(records)} records read, {len(samples)} kept "
            f"({sum(len(s.input_ids) for s in samples):,} tokens, {data['lengths'][0]}-{data['lengths'][1]} each); "
            + ", ".join(f"{task} {count}" for task, count in tasks.items()))
    unknown = sum(not r.get("identities") for r in trained)
    if unknown and not kind.startswith("official:"):
        read += (f"; {unknown} records name no identities (hand-made or official-format records): the held-out rule "
                 "of run cannot check them")
    return categories, rows, _packed(prompts, config, alone), data, read


def _packed(samples: list, config: RouterTrainConfig, alone: bool) -> list[PackedRow]:
    """``samples`` packed into rows of ``pack_tokens`` (`pack`), or each in a row of its own (``alone``)."""
    if alone:
        return [row for s in samples for row in pack([s], config.pack_tokens, config.loss_tokens)]
    return pack(samples, config.pack_tokens, config.loss_tokens)


def spread(items: list, count: int) -> list:
    """``count`` of ``items`` at evenly spaced positions, first and last included (all of them when there are no more):
    records come ordered by length, so the final evaluation sees every length, not the shortest ``count``."""
    if count >= len(items):
        return list(items)
    if count <= 1:
        return list(items[:count])
    return [items[round(i * (len(items) - 1) / (count - 1))] for i in range(count)]


def model_records(config: RouterTrainConfig, tokenizer, progress: bool) -> list[dict[str, Any]]:
    """``data="records"``: the project's router records for ``config.model`` (`RecordsConfig`'s defaults, the
    training seed), measured with its ``tokenizer``."""
    from .router_records import RecordsConfig, make_router_records

    return make_router_records(RecordsConfig(model=config.model, seed=config.seed, progress=progress), tokenizer)


def _row_index(step: int, slot: int, num_rows: int, config: RouterTrainConfig) -> int:
    """Row of the ``slot``-th position of ``step`` in a stream of seeded per-epoch permutations (`_row_order`)."""
    epoch, offset = divmod(step * config.rows_per_step + slot, num_rows)
    return int(_row_order(num_rows, config.seed, epoch)[offset])


def _row_order(num_rows: int, seed: int, epoch: int) -> torch.Tensor:
    """The rows' permutation in epoch ``epoch``."""
    return torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed * 7919 + epoch))


def _noise_generator(seed: int, step: int, slot: int) -> torch.Generator:
    return torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1_000_003 + slot) % (1 << 63))
