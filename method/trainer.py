"""Router training: frozen backbone, trainable routers and Lagrange multipliers; one process or ``torchrun`` + FSDP2.

Paper: https://arxiv.org/abs/2601.17367 §3.2-3.3, Eq. 8, App. D.1 (hyper-parameters in ``reference/method.md`` §5).

Design decisions:
- Only the routers and λ train. The backbone's parameters have ``requires_grad=False`` and are never written.
- Each optimizer step takes ``rows_per_step`` packed rows (the global batch). Row order and Gumbel noise are pure
  functions of (seed, step, row slot), so ``N`` ranks with ``rows_per_step / N`` rows each compute exactly the
  gradients one process computes on the same step: the loss of each row is divided by ``rows_per_step`` and the
  router/λ gradients are summed over ranks (one all-reduce).
- Under ``torchrun`` the backbone is sharded with FSDP2 (``fully_shard`` per decoder layer and on the loss wrapper)
  and the routers, held by the method outside the model, stay replicated.
- Loss of a row: mean token cross-entropy (computed in 2048-token chunks, each recomputed in backward, so no full
  ``[T, vocab]`` logits are kept) plus the per-category Lagrangian of `sparsity_penalty`.
- AdamW (0.9, 0.95), router lr 5e-4 with weight decay 0.1, λ lr 1e-3 ascending (``maximize=True``) without weight
  decay, linear warm-up over 20% of the steps then cosine decay, gradient-norm clip 5.0 over routers and λ.
- bf16 autocast on CUDA; optional gradient checkpointing of the decoder layers.
- Output directory: ``router.safetensors`` + ``router_config.json`` (rewritten at every save), ``train_log.jsonl``
  (one line per step) and ``train_state.pt`` (resume state). Re-running the same command resumes from the last
  save (a complete run is only evaluated again); a different configuration in the same directory is an error.
- The final evaluation (hard ΩMSR per category with argmax routing on prompts of the training data) runs without
  gradients on the fastest inference backend.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpoint import RouterBank, RouterConfig, save_routers
from .data import DEFAULT_TARGETS, PackedRow, check_categories, load_examples, pack, synthetic_records, to_example
from .data import tokenize as tokenize_examples
from .modes import ModeConfig
from .objective import LagrangeMultipliers, omega_msr, sparsity_penalty
from .relaxation import gumbel_noise, temperature

STATE_FILE = "train_state.pt"
LOG_FILE = "train_log.jsonl"
LOSS_CHUNK = 2048
# Fields that do not change what is learned; a resumed run may differ in them.
_RESUMABLE = {"output", "save_every", "device", "backend", "gradient_checkpointing", "eval_samples"}


@dataclass
class TrainConfig:
    """Router-training configuration (defaults: paper / official values, see ``reference/method.md`` §5, §9).

    Attributes:
        model: base model spec (``tiny:qwen3``, ``testbed``, a path or hub id).
        data: training records (JSONL/parquet file or directory) or ``"synthetic"`` (`synthetic_records`).
        output: output directory.
        steps: optimizer steps.
        rows_per_step: packed rows per optimizer step, over all ranks (a multiple of the number of ranks).
        pack_tokens: tokens per packed row.
        max_tokens: per-sample cap (middle truncation of the prompt); None = ``pack_tokens``.
        targets: target ΩMSR per category; every category of the data needs one.
        attention: what the router's sides mean (mode, streaming geometry, XAttention).
        hidden_mult, pooling: router architecture.
        center_features: subtract from the router's pooled keys a fixed per-(layer, KV head) mean, the category-balanced
            mean over the evaluation prompts with full attention, computed once before step 1 (`feature_means`).
        relaxation: ``"softmax"`` (2 logits per head, Gumbel-softmax: the paper's main setting and the released
            checkpoints) or ``"sigmoid"`` (1 logit per head, Gumbel-sigmoid of App. F).
        train_pooling: pooling in training if different (``"mean"``: the official training's whole-prompt mean).
        router_lr, lambda_lr, weight_decay, lambda_weight_decay, betas, grad_clip, warmup, min_lr_ratio: optimizer.
        tau_schedule, tau_init, tau_min, tau_rate: Gumbel temperature (`temperature`).
        penalty: ``"signed"`` (paper) or ``"abs"`` (official); t_interval: optional tolerance around targets.
        loss_tokens: LM loss on the ``"answer"`` tokens (default, as issue 4 asks) or on ``"all"`` tokens (official
            code; ``reference/method.md`` §9 #15).
        synthetic_samples, synthetic_length: size of the synthetic data set.
        backend: differentiable attention backend; None = ``reference`` on CPU, ``flex`` on CUDA.
        gradient_checkpointing: recompute decoder layers in backward.
        device, dtype: where the backbone runs (CUDA and bf16 when available).
        seed: router initialisation, λ initialisation, row order and Gumbel noise.
        save_every: steps between checkpoints.
        eval_samples: prompts per category for the final hard-ΩMSR evaluation.
    """

    model: str = "tiny:qwen3"
    data: str = "synthetic"
    output: str = "runs/router"
    steps: int = 300
    rows_per_step: int = 8
    pack_tokens: int = 65536
    max_tokens: int | None = None
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
    loss_tokens: str = "answer"
    synthetic_samples: int = 256
    synthetic_length: int = 400
    backend: str | None = None
    gradient_checkpointing: bool = False
    device: str | None = None
    dtype: str | None = None
    seed: int = 0
    save_every: int = 50
    eval_samples: int = 16

    def __post_init__(self):
        if isinstance(self.attention, dict):
            self.attention = ModeConfig(**self.attention)
        self.betas = tuple(self.betas)
        self.t_interval = tuple(self.t_interval) if self.t_interval is not None else None
        checks = {
            "steps must be >= 1": self.steps >= 1,
            "rows_per_step must be >= 1": self.rows_per_step >= 1,
            "pack_tokens must be >= 2": self.pack_tokens >= 2,
            "targets must lie in [0, 1]": all(0.0 <= t <= 1.0 for t in self.targets.values()),
            "warmup must lie in [0, 1)": 0.0 <= self.warmup < 1.0,
            "penalty must be 'signed' or 'abs'": self.penalty in ("signed", "abs"),
            "loss_tokens must be 'all' or 'answer'": self.loss_tokens in ("all", "answer"),
            "tau_schedule must be 'exponential' or 'cosine'": self.tau_schedule in ("exponential", "cosine"),
            "pooling must be 'boundary' or 'mean'": self.pooling in ("boundary", "mean"),
            "relaxation must be 'softmax' or 'sigmoid'": self.relaxation in ("softmax", "sigmoid"),
            "train_pooling must be 'boundary', 'mean' or None": self.train_pooling in (None, "boundary", "mean"),
            "dtype must be bfloat16, float16 or float32": self.dtype in (None, "bfloat16", "float16", "float32"),
            "save_every must be >= 1": self.save_every >= 1,
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
    """What `train` returns: the trained routers, λ, the per-step log and the final hard ΩMSR per category."""

    routers: RouterBank
    lambdas: dict[str, tuple[float, float]]
    log: list[dict[str, Any]]
    final_omega: dict[str, float]


def train(config: TrainConfig, progress: bool = True, loaded: tuple[nn.Module, Any] | None = None) -> TrainResult:
    """Train routers as configured; resumes from ``config.output`` when it holds a run of the same configuration.

    Args:
        config: the run.
        progress: show a progress bar (rank 0).
        loaded: an already loaded ``(model, tokenizer)`` of ``config.model`` to use instead of loading it (single
            process); its parameters are frozen in place and never modified.
    """
    from elastic_bench.attention import apply
    from elastic_bench.distributed import Ranks
    from elastic_bench.methods.elastic import Elastic, model_layout
    from elastic_bench.models import load_model

    ranks = Ranks.from_env(config.device)
    if loaded is not None and ranks.world_size > 1:
        raise ValueError("a preloaded model cannot be trained under torchrun; pass the model spec in the config")
    model, tokenizer = loaded or load_model(
        config.model, dtype=getattr(torch, config.dtype) if config.dtype else None, device=ranks.device(config.device)
    )
    device = next(model.parameters()).device
    backend = training_backend(config.backend, device)
    if config.rows_per_step % ranks.world_size:
        raise ValueError(f"rows_per_step={config.rows_per_step} is not a multiple of the {ranks.world_size} ranks")
    model.requires_grad_(False)
    if config.gradient_checkpointing:
        options = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the older name warns there
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
        model.train()  # transformers checkpoints layers only in training mode; the LLMs served here have no dropout

    categories, rows, eval_rows = _data(config, tokenizer, progress and ranks.is_main)
    layers, kv_heads, head_dim = model_layout(model)
    gen = torch.Generator().manual_seed(config.seed)
    bank = RouterConfig(
        layers, kv_heads, head_dim, base_model=config.model, hidden_mult=config.hidden_mult, pooling=config.pooling,
        num_logits=2 if config.relaxation == "softmax" else 1, attention=config.attention,
        center_features=config.center_features,
    ).build()
    for router in bank.layers:
        router.reset_parameters(gen)
    if config.center_features:  # a resumed run overwrites it with the saved one
        feature_means(model, bank, eval_rows, len(categories), device)
    lambdas = LagrangeMultipliers(len(categories), gen)
    bank.to(device)
    lambdas.to(device)
    optimizer = torch.optim.AdamW(
        [
            {"params": list(bank.parameters()), "lr": config.router_lr, "weight_decay": config.weight_decay},
            {"params": list(lambdas.parameters()), "lr": config.lambda_lr, "weight_decay": config.lambda_weight_decay,
             "maximize": True},
        ],
        betas=config.betas,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, config))
    output = Path(config.output)
    start = _resume(output, config, bank, lambdas, optimizer, scheduler, device)
    log = _read_log(output, start, rewrite=ranks.is_main)
    targets = torch.tensor([config.targets[c] for c in categories], device=device)

    method = Elastic()
    method.routers = bank
    loss_model = LossModel(model)
    if ranks.world_size > 1:
        _shard(loss_model, model, device)
    trainable = list(bank.parameters()) + list(lambdas.parameters())

    from tqdm.auto import tqdm

    bar = tqdm(total=config.steps, initial=start, desc="train-router", disable=not (progress and ranks.is_main),
               file=sys.stderr)
    with apply(method, model, backend=backend) as handle:
        for step in range(start, config.steps):
            began = time.perf_counter()
            tau = temperature(step, config.steps, config.tau_schedule, config.tau_init, config.tau_min,
                              config.tau_rate)
            optimizer.zero_grad(set_to_none=False)
            tally = torch.zeros(3 + 2 * len(categories), dtype=torch.float64)  # lm, penalty, rows, Ω sum/count
            for slot in range(ranks.rank, config.rows_per_step, ranks.world_size):
                handle.reset()
                row = rows[_row_index(step, slot, len(rows), config)]
                noise = gumbel_noise((row.num_samples, layers, kv_heads, 2), _noise_generator(config.seed, step, slot))
                method.begin_training_forward(tau, noise, row.prompt_lens, config.train_pooling)
                with _autocast(device):
                    loss_sum, count = loss_model(*_row_inputs(row, device))
                r = method.collect_decisions(row.num_samples, layers)
                omega = omega_msr(r)
                cats = row.categories.to(device)
                lm = loss_sum / count.clamp(min=1)
                penalty = sparsity_penalty(omega, cats, targets, lambdas, config.penalty, config.t_interval)
                ((lm + penalty) / config.rows_per_step).backward()
                tally[0] += float(lm.detach())
                tally[1] += float(penalty.detach())
                tally[2] += 1
                hard = omega.detach().double().cpu()
                tally[3:3 + len(categories)].index_add_(0, row.categories, hard)
                tally[3 + len(categories):].index_add_(0, row.categories, torch.ones_like(hard))
            method.end_training()
            if ranks.world_size > 1:
                _all_reduce_grads(trainable)
                tally = _all_reduce_tally(tally, device)
            router_grad_norm = torch.stack([p.grad.norm() for p in bank.parameters()]).norm()
            grad_norm = torch.nn.utils.clip_grad_norm_(trainable, config.grad_clip)
            optimizer.step()
            scheduler.step()
            record = _log_record(step, tau, scheduler, tally, categories, lambdas, began, device)
            record.update(grad_norm=float(grad_norm), router_grad_norm=float(router_grad_norm))
            if ranks.world_size > 1 and "max_memory_gib" in record:
                record["max_memory_gib_per_rank"] = ranks.gather(record["max_memory_gib"])
            log.append(record)
            if ranks.is_main:
                _append_log(output, record)
                bar.update(1)
                bar.set_postfix_str(_postfix(record, categories))
            if (step + 1) % config.save_every == 0 or step + 1 == config.steps:
                _save(output, config, bank, lambdas, optimizer, scheduler, step + 1, categories, ranks)
        bar.close()
    replica_diff = _replica_divergence(trainable, ranks)
    if replica_diff:
        raise RuntimeError(f"router replicas diverged across ranks (max abs difference {replica_diff:.3g})")
    # Evaluation needs no gradient: the fastest inference backend (a compiled one would recompile per prompt length).
    with apply(method, model, backend="auto") as handle:
        final = evaluate_routing(handle, loss_model, eval_rows, categories, device)
    table = lambdas.table(categories)
    result_lambdas = {c: (table["lambda1"][c], table["lambda2"][c]) for c in categories}
    if ranks.is_main:
        _save(output, config, bank, lambdas, optimizer, scheduler, config.steps, categories, ranks, final,
              replica_diff if ranks.world_size > 1 else None)
    ranks.barrier()
    return TrainResult(bank, result_lambdas, log, final)


def feature_means(model: nn.Module, bank, rows: list[PackedRow], num_categories: int, device) -> None:
    """Set each router's ``feature_mean [H, D]``: the mean over categories of the per-category mean pooled pre-RoPE key
    of the prompts of ``rows``, with full attention on every head."""
    from elastic_bench.attention import apply
    from elastic_bench.methods.base import Method

    layers, heads, dim = len(bank.layers), bank.config.num_kv_heads, bank.config.head_dim
    sums = torch.zeros(num_categories, layers, heads, dim, dtype=torch.float64)
    counts = torch.zeros(num_categories, dtype=torch.float64)
    current: dict[str, Any] = {}

    class _Pool(Method):
        needs_pre_rope_keys = True

        def prefill_plan(self, call):
            pooled = bank[call.layer_idx].pool(call.pre_rope_keys).double().cpu()  # [1, H, D]
            sums[current["cat"][call.sample_ids[0]], call.layer_idx] += pooled[0]
            full = torch.ones(call.batch_size, call.num_kv_heads, dtype=torch.bool, device=call.query.device)
            return bank.config.attention.plan(full, call.query, call.key)

    loss_model = LossModel(model)
    with torch.no_grad(), _autocast(device), apply(_Pool(), model, backend="auto"):
        for row in rows:
            current["cat"] = row.categories.tolist()
            loss_model(*_row_inputs(row, device)[:4], None)
            counts.index_add_(0, row.categories, torch.ones(row.num_samples, dtype=torch.float64))
    present = counts > 0
    mean = (sums[present] / counts[present][:, None, None, None]).mean(dim=0)
    for layer, router in enumerate(bank.layers):
        router.feature_mean.copy_(mean[layer].float())


def training_backend(requested: str | None, device: torch.device) -> str:
    """The differentiable attention backend for ``device``: ``reference`` on CPU, ``flex`` on CUDA by default."""
    from elastic_bench.kernels import available_backends

    name = requested or ("flex" if device.type == "cuda" else "reference")
    if name not in ("reference", "flex"):
        raise ValueError(f"training needs a differentiable attention backend (reference or flex), got {name!r}")
    if name not in available_backends(device):
        raise ValueError(
            f"attention backend {name!r} is not available on {device} (available: "
            f"{', '.join(available_backends(device))}); train with --backend reference"
        )
    return name


def lr_factor(step: int, config: TrainConfig) -> float:
    """Linear warm-up over ``warmup·steps`` steps, then cosine decay to ``min_lr_ratio``."""
    warm = math.ceil(config.warmup * config.steps)
    if step < warm:
        return (step + 1) / warm
    progress = (step - warm) / max(1, config.steps - warm)
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


class LossModel(nn.Module):
    """The causal LM plus its chunked token cross-entropy; the FSDP2 root under ``torchrun``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int,
        targets: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Packed row ``input_ids/position_ids/targets [T]``, ``cu_seqlens [N + 1]`` → (summed CE, token count);
        None without targets (a routing-only forward)."""
        hidden = self.model.base_model(
            input_ids=input_ids[None], position_ids=position_ids[None], cu_seq_lens_q=cu_seqlens,
            cu_seq_lens_k=cu_seqlens, max_length_q=max_len, max_length_k=max_len, use_cache=False,
        ).last_hidden_state[0]
        if targets is None:
            return None
        head = self.model.get_output_embeddings()
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, hidden.shape[0], LOSS_CHUNK):
            piece = slice(start, start + LOSS_CHUNK)
            total = total + torch.utils.checkpoint.checkpoint(
                _chunk_cross_entropy, hidden[piece], targets[piece], head, use_reentrant=False
            )
        return total, (targets != -100).sum()


def _chunk_cross_entropy(hidden: torch.Tensor, targets: torch.Tensor, head: nn.Module) -> torch.Tensor:
    logits = head(hidden).float()
    return torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")


def evaluate_routing(handle, loss_model: LossModel, rows: list[PackedRow], categories: list[str], device):
    """Mean hard ΩMSR per category with the deterministic (argmax) routers of ``handle``'s method on prompt-only
    rows."""
    sums, counts = [0.0] * len(categories), [0] * len(categories)
    with torch.no_grad(), _autocast(device):
        for row in rows:
            handle.reset()
            loss_model(*_row_inputs(row, device)[:4], None)
            for sample, cat in zip(handle.stats()["per_sample"], row.categories.tolist()):
                sums[cat] += sample["omega_msr"]
                counts[cat] += 1
    return {c: sums[i] / counts[i] for i, c in enumerate(categories) if counts[i]}


# ---- data ----------------------------------------------------------------------------------------------------------


def _data(config: TrainConfig, tokenizer, progress: bool) -> tuple[list[str], list[PackedRow], list[PackedRow]]:
    if config.data == "synthetic":
        records = synthetic_records(config.synthetic_samples, config.synthetic_length, config.seed)
        examples = [to_example(r) for r in records]
    else:
        examples = load_examples(config.data, config.targets)
    categories = check_categories(examples, config.targets)
    max_tokens = config.max_tokens or config.pack_tokens
    samples = tokenize_examples(examples, tokenizer, categories, max_tokens, progress)
    rows = pack(samples, config.pack_tokens, config.loss_tokens)
    picked: list = []
    for index in range(len(categories)):
        picked += [s for s in samples if s.category == index][: config.eval_samples]
    prompts = [dataclasses.replace(s, input_ids=s.input_ids[: s.prompt_len]) for s in picked]
    return categories, rows, pack(prompts, config.pack_tokens, config.loss_tokens)


def _row_index(step: int, slot: int, num_rows: int, config: TrainConfig) -> int:
    """Row of the ``slot``-th position of ``step`` in a stream of seeded per-epoch permutations."""
    position = step * config.rows_per_step + slot
    epoch, offset = divmod(position, num_rows)
    order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(config.seed * 7919 + epoch))
    return int(order[offset])


def _noise_generator(seed: int, step: int, slot: int) -> torch.Generator:
    return torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1_000_003 + slot) % (1 << 63))


def _row_inputs(row: PackedRow, device) -> tuple:
    max_len = int((row.cu_seqlens[1:] - row.cu_seqlens[:-1]).max())
    return (row.input_ids.to(device), row.position_ids.to(device), row.cu_seqlens.to(device), max_len,
            row.targets.to(device))


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


# ---- distributed ---------------------------------------------------------------------------------------------------


def _shard(loss_model: LossModel, model: nn.Module, device: torch.device) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in model.base_model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(loss_model, mesh=mesh)


def _all_reduce_grads(params: list[nn.Parameter]) -> None:
    import torch.distributed as dist

    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    for p, g in zip(params, grads):
        p.grad = g
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset: offset + g.numel()].view_as(g))
        offset += g.numel()


def _replica_divergence(params: list[nn.Parameter], ranks) -> float:
    """Largest absolute difference between this rank's routers/λ and any other rank's (0.0 for one process)."""
    if ranks.world_size == 1:
        return 0.0
    import torch.distributed as dist

    flat = torch.cat([p.detach().float().flatten() for p in params])
    copies = [torch.empty_like(flat) for _ in range(ranks.world_size)]
    dist.all_gather(copies, flat)
    return max(float((c - flat).abs().max()) for c in copies)


def _all_reduce_tally(tally: torch.Tensor, device: torch.device) -> torch.Tensor:
    import torch.distributed as dist

    moved = tally.to(device)
    dist.all_reduce(moved)
    return moved.cpu()


# ---- logging, saving, resuming -------------------------------------------------------------------------------------


def _log_record(step, tau, scheduler, tally, categories, lambdas, began, device) -> dict[str, Any]:
    k = len(categories)
    rows = max(1.0, float(tally[2]))
    record = {
        "step": step + 1,
        "tau": round(tau, 6),
        "lr_router": scheduler.get_last_lr()[0],
        "lm_loss": float(tally[0]) / rows,
        "penalty": float(tally[1]) / rows,
        "omega_msr": {c: float(tally[3 + i] / tally[3 + k + i]) for i, c in enumerate(categories) if tally[3 + k + i]},
        **lambdas.table(categories),
        "seconds": time.perf_counter() - began,
    }
    if device.type == "cuda":
        record["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return record


def _postfix(record: dict[str, Any], categories: list[str]) -> str:
    omega = " ".join(f"{c[:12]}={record['omega_msr'][c]:.2f}" for c in categories if c in record["omega_msr"])
    return f"lm={record['lm_loss']:.3f} τ={record['tau']:.2f} Ω[{omega}]"


def _append_log(output: Path, record: dict[str, Any]) -> None:
    output.mkdir(parents=True, exist_ok=True)
    with (output / LOG_FILE).open("a") as handle:
        handle.write(json.dumps(record) + "\n")


def _read_log(output: Path, start: int, rewrite: bool) -> list[dict[str, Any]]:
    """Log records of the first ``start`` steps; with ``rewrite``, later lines (written after the last save, by an
    interrupted run) are removed from the file."""
    path = output / LOG_FILE
    if not path.exists():
        return []
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a torn last line
            continue
        if record["step"] <= start:
            kept.append(record)
    if rewrite:
        path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return kept


def _fingerprint(config: TrainConfig) -> dict[str, Any]:
    """The configuration fields that define the run, JSON-normalised (tuples as lists)."""
    return json.loads(json.dumps({k: v for k, v in config.to_dict().items() if k not in _RESUMABLE}))


def _resume(output: Path, config: TrainConfig, bank, lambdas, optimizer, scheduler, device) -> int:
    path = output / STATE_FILE
    if not path.exists():
        return 0
    state = torch.load(path, map_location=device, weights_only=False)
    fingerprint = _fingerprint(config)
    if state["config"] != fingerprint:
        changed = sorted(k for k in fingerprint.keys() | state["config"].keys()
                         if state["config"].get(k) != fingerprint.get(k))
        raise ValueError(f"{output} holds a router run with a different configuration ({', '.join(changed)}); "
                         "use another --output or delete it")
    bank.load_state_dict(state["routers"])
    lambdas.load_state_dict(state["lambdas"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return int(state["step"])


def _save(output, config, bank, lambdas, optimizer, scheduler, step, categories, ranks, final=None,
          replica_diff=None) -> None:
    if not ranks.is_main:
        return
    from elastic_bench.provenance import provenance

    bank.config.training = {
        **config.to_dict(),
        "steps_done": step,
        "categories": categories,
        **lambdas.table(categories),
        **({"final_omega_msr": final} if final is not None else {}),
        **({"replica_max_abs_diff": replica_diff} if replica_diff is not None else {}),
        **provenance(next(bank.parameters()).device),
    }
    save_routers(bank, output)
    state = {
        "config": _fingerprint(config),
        "step": step,
        "routers": bank.state_dict(),
        "lambdas": lambdas.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
    }
    tmp = output / f".{STATE_FILE}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, output / STATE_FILE)
