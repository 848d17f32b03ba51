"""Training the testbed model from scratch: a 6-layer Llama that reads up to 4K tokens of testbed prompts.

Design decisions (the recipe, its measurements and the runs behind them: docs/testbed.md):
- Llama architecture, 6 layers, hidden 256, 8 query / 2 KV heads of dim 32, MLP 768, untied LM head (6.8M
  parameters); word-level vocabulary (`elastic_bench.testbed.vocab`): byte-level tokens learned nothing in the same
  time.
- Data: the task generators (`elastic_bench.testbed.generators`), mixed per sample; every sequence is filled to the
  step's length exactly, so batches need no padding. The loss weighs answer tokens 1, question/prefix tokens 0.1 and
  the text `TestbedTrainConfig.context_weight` (0 by default), and the LM head runs on the weighted positions only.
  ``niah_multikey`` sequences also query their three distractors after the answer (more answer tokens per sequence;
  evaluation prompts never have them).
- Context curriculum: 256 → 512 → 1K → 2K → 4K, each for `TestbedTrainConfig.stage_fraction` of the steps, then
  1K/2K/4K mixed (4K half the time). Tokens per step are constant, so a step costs about the same at every length.
- Some steps (`TestbedTrainConfig.streaming_fraction`, once sequences exceed the window) train every task the way the
  harness runs a prefill method: the prompt under the testbed's sink + window streaming mask
  (`elastic_bench.testbed.STREAMING_SINK`, `STREAMING_LOCAL`), the answer densely. The robust answers then do not
  depend on the middle of the context, which is what the robust family stands for, and a needle answer opens with a
  value even when the needle is out of sight (no template words first, from which the dense decode steps could still
  find it).
- The log follows key matching, the skill that decides the needle tasks and forms late and rarely (docs/testbed.md): at
  every checkpoint, the selectivity of the best key-matching head (`heads.key_matching`, 8 prompts).
- Deterministic from the seed: the weights' initialisation, the batch of step ``s`` (a function of ``(seed, s)``
  alone, whatever the number of data workers) and, through `deterministic_algorithms`, the kernels. AdamW with fp32
  master weights under bf16 autocast on the GPU; warm-up then cosine decay to 10%.
- The loop, checkpoints (every `RunOptions.save_every` steps, at the end and on a time limit; a rerun with the same
  output folder resumes), the training state and the log are the training engine's (`elastic_bench.training.engine`);
  `TestbedObjective` is this trainer's part of it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from elastic_bench.foundation.files import exclusive, write_json
from elastic_bench.kernels import StreamingGeometry
from elastic_bench.training.engine import (
    Objective,
    RunOptions,
    autocast,
    deterministic_algorithms,
    fingerprint,
    fit,
)

from .. import STREAMING_LOCAL, STREAMING_SINK
from ..generators import SPECS, Generator
from ..vocab import Vocab, build
from .evaluate import exact_match, family_means, hidden_states, window_mask
from .heads import best_head, key_matching

RECORD = "TRAINING.json"
# (layer, query head) of the heads `TestbedTrainConfig.attention_aux_weight` supervises (writer and matcher where the
# shipped model has them, docs/testbed.md) and the batch keys of their query positions and target positions (None: two
# tokens back).
ATTENTION_AUX_HEADS = {"writer": ((1, 1), ("needle_values", None)), "matcher": ((3, 1), ("asked", "asked_needles")),
                       "reader": ((5, 1), ("copies", "copy_sources"))}


@dataclass
class TestbedTrainConfig:
    """Everything that determines the trained weights (and the evaluation run at the end), and the device; how a run
    executes is `RunOptions`. The defaults are the shipped checkpoint's first-stage recipe (docs/testbed.md, "How it
    was trained").

    Attributes:
        seed: initialisation and data seed.
        steps: optimiser steps.
        batch_tokens: tokens per step (batch size = batch_tokens // length).
        min_length: the first curriculum length in tokens; the curriculum doubles it up to ``max_length``.
        max_length: the longest training length in tokens (also the model's ``max_position_embeddings``).
        stage_fraction: fraction of the steps spent at each curriculum length.
        mix_weights: after the curriculum, the probabilities of the last three curriculum lengths.
        task_weights: sampling probability of each task (`generators.SPECS` names).
        curriculum_task_weights: the task probabilities during the curriculum (None: ``task_weights``), e.g. only
            ``niah_multikey`` so that key matching forms before the easier positional tasks join.
        curriculum_needles: during the curriculum, ``niah_multikey`` hides ``min(curriculum_needles, length // 64)``
            needles (at least its usual 4): with many distractors, choosing a needle by position or by elimination
            rarely pays, and matching the queried key does.
        context_weight: loss weight of the instruction and context tokens (answers weigh 1, questions and prefixes
            `generators.PROMPT_WEIGHT`): a light language-modelling loss on the text itself, whose repeated needle
            template rewards copying by content (what it did and did not change: docs/testbed.md).
        key_aux_weight: weight of an auxiliary loss (0: none) in which a linear head, trained with the model and not
            exported, predicts each context needle's key from the hidden state of the needle's first value token.
            It trains directly the heads that write a needle's key into its value, the half of the key-matching
            circuit that otherwise lowers the loss only once the other half exists (docs/testbed.md, "What the
            shipped model does that the others do not").
        value_aux_weight: weight of a second auxiliary loss (0: none) in which the same head predicts, at each
            question's key token, the first value token of the needle with that key: the matching half of the
            circuit, supervised where the shipped model computes it (its effect: docs/testbed.md, "Notes on the
            training options").
        attention_aux_weight: weight of an auxiliary loss (0: none) on the attention of three designated query heads
            (`ATTENTION_AUX_HEADS`): the two halves of the shipped model's key matching (the *writer* attends from
            each needle's first value token to the needle's key, two tokens back; the *matcher* from each question's
            key token to the first value token of the needle with that key) and a *reader* that attends from each
            position predicting an answer token to the context token it copies (the needle's value, the repeated
            sentence). Cross-entropy of each head's causal attention at those positions against the target
            position; no parameter is added, and streaming steps are not supervised (docs/testbed.md, "Attention
            supervision").
        end_slack: after the curriculum, each training sequence ends a uniform 0 … ``end_slack`` tokens before the
            step's length and is padded after its ``</s>`` (no loss; causal attention never reads it). With 0, every
            sequence ends at the step's last position, and a model can learn to close an answer there by absolute
            position, which evaluation prompts (ending earlier) do not reward (docs/testbed.md, "Notes on the
            training options").
        first_token_weight: loss weight of each answer's first token (the other answer tokens weigh 1). For the
            needle tasks it is the token that names the needle chosen; the later pieces can be copied from it.
        streaming_fraction: share of the post-curriculum steps trained under `streaming`.
        streaming_tasks: the tasks of those steps: ``"all"`` (the `task_weights` mixture) or ``"robust"`` (its robust
            tasks); why ``"all"`` is the recipe: docs/testbed.md, "Why pairs of digits, and why every task is
            streamed in training".
        dense_decode: in those steps, the positions after each prompt (the answer, which the harness decodes with
            dense attention after a streaming prefill) attend densely (`evaluate.window_mask` with the prompts'
            ends); False: streaming everywhere (what that trained: docs/testbed.md, "Notes on the training
            options").
        streaming: the sink + window geometry of those steps (and of the final evaluation).
        rope_theta: the model's RoPE base.
        deterministic: run with PyTorch's deterministic kernels (`deterministic_algorithms`).
        lr: peak AdamW learning rate.
        warmup_fraction: fraction of the steps of linear learning-rate warm-up (then cosine decay, `learning_rate`).
        min_lr_ratio: learning rate at the end of the cosine decay, as a fraction of ``lr``.
        weight_decay: AdamW weight decay of the matrices (vectors and biases have none).
        grad_clip: clip of the model's total gradient norm (the auxiliary head is not clipped).
        eval_samples: samples per task and length of the final evaluation (0: none); a resumed run may change it.
        init_from: start from the weights of an exported testbed model (a folder with ``model.safetensors``)
            instead of a seeded initialisation: a second training stage with another mixture.
        device: cuda or cpu (none: cuda when available).
    """

    __test__ = False  # not a pytest class

    seed: int = 1
    steps: int = 7500
    batch_tokens: int = 65536
    min_length: int = 256
    max_length: int = 4096
    stage_fraction: float = 0.06
    mix_weights: tuple[float, ...] = (0.25, 0.25, 0.5)
    task_weights: dict[str, float] = field(
        default_factory=lambda: {"niah_multikey": 0.45, "repeat": 0.2, "niah_recent": 0.2, "niah_single": 0.15}
    )
    curriculum_task_weights: dict[str, float] | None = field(default_factory=lambda: {"niah_multikey": 1.0})
    curriculum_needles: int = 4
    context_weight: float = 0.0
    key_aux_weight: float = 0.0
    value_aux_weight: float = 0.0
    attention_aux_weight: float = 1.0
    end_slack: int = 16
    first_token_weight: float = 1.0
    streaming_fraction: float = 0.2
    streaming_tasks: str = "all"
    dense_decode: bool = True
    streaming: tuple[int, int] = (STREAMING_SINK, STREAMING_LOCAL)
    rope_theta: float = 10000.0
    deterministic: bool = True
    lr: float = 1.5e-3
    warmup_fraction: float = 0.02
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_samples: int = 100
    init_from: str | None = None
    device: str | None = None

    def __post_init__(self):
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.steps < 1 or self.batch_tokens < self.max_length:
            raise ValueError(f"need steps >= 1 and batch_tokens >= max_length, got {self.steps}, {self.batch_tokens}")
        if self.min_length > self.max_length or self.min_length < 128:
            raise ValueError(f"need 128 <= min_length <= max_length, got {self.min_length}, {self.max_length}")
        unknown = (set(self.task_weights) | set(self.curriculum_task_weights or {})) - set(SPECS)
        if unknown:
            raise ValueError(f"unknown testbed tasks {sorted(unknown)}; known: {list(SPECS)}")
        self.mix_weights, self.streaming = tuple(self.mix_weights), tuple(self.streaming)
        if min(self.mix_weights) < 0 or sum(self.mix_weights) <= 0:
            raise ValueError(f"mix weights must be non-negative with a positive sum, got {self.mix_weights}")
        if min(self.key_aux_weight, self.value_aux_weight, self.attention_aux_weight) < 0:
            raise ValueError(f"key_aux_weight, value_aux_weight and attention_aux_weight must be non-negative, got "
                             f"{self.key_aux_weight}, {self.value_aux_weight}, {self.attention_aux_weight}")
        if not 0 <= self.end_slack <= self.min_length // 4:
            raise ValueError(f"end_slack must be in [0, min_length // 4], got {self.end_slack}")
        if not 0 <= self.streaming_fraction <= 1:
            raise ValueError(f"streaming_fraction must be in [0, 1], got {self.streaming_fraction}")
        if self.streaming_tasks not in ("all", "robust"):
            raise ValueError(f"streaming_tasks must be 'all' or 'robust', got {self.streaming_tasks!r}")
        if not 0 <= self.context_weight < 1:
            raise ValueError(f"context_weight must be in [0, 1), got {self.context_weight}")
        if self.first_token_weight <= 0 or self.curriculum_needles < 1:
            raise ValueError(f"need first_token_weight > 0 and curriculum_needles >= 1, got {self.first_token_weight}, "
                             f"{self.curriculum_needles}")

    @property
    def curriculum(self) -> list[int]:
        lengths = [self.min_length]
        while lengths[-1] * 2 <= self.max_length:
            lengths.append(lengths[-1] * 2)
        return lengths

    @property
    def curriculum_steps(self) -> int:
        """Steps of the curriculum (after them, lengths are mixed)."""
        return max(1, round(self.stage_fraction * self.steps)) * len(self.curriculum)

    @property
    def eval_lengths(self) -> list[int]:
        """The lengths mixed after the curriculum (the last ones of the curriculum), also the evaluated ones."""
        return self.curriculum[-len(self.mix_weights):]

    @property
    def mix_probabilities(self) -> np.ndarray:
        weights = np.array(self.mix_weights[-len(self.eval_lengths):])
        return weights / weights.sum()

    @property
    def geometry(self) -> StreamingGeometry:
        return StreamingGeometry(*self.streaming)


def model_config(vocab: Vocab, max_length: int = 4096, rope_theta: float = 10000.0):
    """The testbed's `LlamaConfig` (6.8M parameters)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(vocab), hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=8,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=max_length, rope_theta=rope_theta,
        tie_word_embeddings=False, bos_token_id=vocab.bos_id, eos_token_id=vocab.eos_id, pad_token_id=vocab.pad_id,
        attn_implementation="sdpa",
    )


class Batches(torch.utils.data.Dataset):
    """Item ``s`` is the batch of step ``s``: a pure function of ``(config.seed, s)``.

    A batch holds numpy arrays (passed from data workers through pipes, not shared memory): ``ids [B, L]``,
    ``positions [T]`` (flat indices into ``ids`` of the tokens whose next token is scored), ``targets [T]``,
    ``weights [T]`` (loss weights), ``answer [T]`` (bool: an answer token or ``</s>``), ``first [T]`` (bool: an
    answer's first token, which for the needle tasks names the needle chosen), ``task [T]`` (index into
    `generators.SPECS` of the sequence's task), ``prompt_ends [B]`` (each row's first answer position),
    ``streaming`` (bool: train under the streaming mask), and with
    an auxiliary loss, ``needle_values [N]`` (flat indices of the context needles' first value tokens),
    ``needle_keys [N]`` (their keys' token ids), ``asked [Q]`` (flat indices of the key tokens of questions and
    answer prefixes), ``asked_values [Q]`` (the first value token of the needle with that key) and ``asked_needles
    [Q]`` (that token's flat index).
    """

    def __init__(self, config: TestbedTrainConfig, vocab: Vocab):
        self.config, self.vocab, self.generator = config, vocab, Generator(vocab)
        self.mixture = _mixture(config.task_weights)
        self.curriculum_mixture = _mixture(config.curriculum_task_weights or config.task_weights)
        self.streaming_mixture = self.mixture if config.streaming_tasks == "all" else _mixture(
            {t: w for t, w in config.task_weights.items() if SPECS[t].category == "robust"})

    def __len__(self) -> int:
        return self.config.steps

    def provenance(self, steps: int) -> dict[str, Any]:
        """What the first ``steps`` batches hold (`elastic_bench.training.provenance`): the testbed's generators of
        the tasks the mixtures draw on, their lengths, rows and tokens (a batch is ``batch_tokens // length`` rows of
        ``length`` tokens); the digest is that of the configuration, which defines every batch."""
        from elastic_bench.training.provenance import data_provenance, definition_digest, learned_provenance

        cfg = self.config
        lengths = [self.length_at(step, np.random.default_rng([cfg.seed, step])) for step in range(steps)] or [0]
        names = [t for t, w in {**cfg.task_weights, **(cfg.curriculum_task_weights or {})}.items() if w > 0]
        identities = {identity for name in names for identity in SPECS[name].identities}
        tasks = {f"testbed_{name}": SPECS[name].category for name in names}
        definition = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "device"}
        rows = sum(cfg.batch_tokens // length for length in lengths if length)
        data = data_provenance("synthetic", definition_digest(definition), identities, tasks,
                               (min(lengths), max(lengths)), rows)
        return learned_provenance(data, steps, sum((cfg.batch_tokens // n) * n for n in lengths if n))

    def length_at(self, step: int, rng: np.random.Generator) -> int:
        cfg = self.config
        stage = int(step // max(1, round(cfg.stage_fraction * cfg.steps)))
        if stage < len(cfg.curriculum):
            return cfg.curriculum[stage]
        return int(rng.choice(cfg.eval_lengths, p=cfg.mix_probabilities))

    def __getitem__(self, step: int) -> dict[str, Any]:
        cfg = self.config
        rng = np.random.default_rng([cfg.seed, step])
        length = self.length_at(step, rng)
        after_curriculum = step >= cfg.curriculum_steps
        streaming = bool(self.streaming_mixture[0] and after_curriculum and length > sum(cfg.streaming)
                         and rng.random() < cfg.streaming_fraction)
        tasks, p = (self.streaming_mixture if streaming else self.mixture if after_curriculum
                    else self.curriculum_mixture)
        batch = cfg.batch_tokens // length
        ids = np.empty((batch, length), dtype=np.int64)
        weights = np.empty((batch, length), dtype=np.float32)
        row_tasks = rng.choice(tasks, size=batch, p=p)
        needles = None if after_curriculum else min(cfg.curriculum_needles, length // 64)
        for row, task in enumerate(row_tasks):
            spec = SPECS[task]
            count = max(spec.num_needles, needles) if needles and spec.followups else None
            end = length - (int(rng.integers(0, cfg.end_slack + 1)) if cfg.end_slack and after_curriculum else 0)
            example = self.generator.example(spec, rng, end, training=True, num_needles=count)
            ids[row, :end], weights[row, :end] = example.training_sequence(self.vocab, cfg.context_weight)
            ids[row, end:], weights[row, end:] = self.vocab.pad_id, 0.0  # after </s>: never attended, no loss
        scored = np.flatnonzero(weights[:, 1:] > 0)  # flat over [B, L-1]: predicting token t+1 from position t
        rows, cols = np.divmod(scored, length - 1)
        answer = weights[rows, cols + 1] == 1.0
        first = answer & (weights[rows, cols] != 1.0)
        prompt_ends = np.full(batch, length, dtype=np.int64)
        np.minimum.at(prompt_ends, rows[first], cols[first] + 1)
        auxiliary = cfg.key_aux_weight or cfg.value_aux_weight or cfg.attention_aux_weight
        extra = self._aux_targets(ids) if auxiliary else {}
        if cfg.attention_aux_weight:
            extra |= _copy_sources(ids, rows * length + cols, answer, first)
        return {
            **extra,
            "ids": ids,
            "positions": rows * length + cols,
            "targets": ids[rows, cols + 1],
            "weights": np.where(first, np.float32(cfg.first_token_weight), weights[rows, cols + 1]),
            "answer": answer,
            "first": first,
            "task": np.array([list(SPECS).index(t) for t in row_tasks], dtype=np.int64)[rows],
            "prompt_ends": prompt_ends,
            "streaming": streaming,
        }

    def _aux_targets(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Where each needle of ``ids [B, L]`` starts its value (``{key} is {number}``: questions never have a number
        there) and which key it belongs to; where questions name a key, and that needle's first value token and its
        position."""
        vocab, length = self.vocab, ids.shape[1]
        keys = np.isin(ids, vocab.key_ids)
        needle = np.zeros_like(keys)
        needle[:, :-2] = keys[:, :-2] & (ids[:, 1:-1] == self.generator.is_) & np.isin(ids[:, 2:], vocab.number_ids)
        rows, cols = np.nonzero(needle)
        first_value = {(r, ids[r, c]): r * length + c + 2 for r, c in zip(rows, cols)}
        asked_rows, asked_cols = np.nonzero(keys & ~needle)
        asked_needles = np.array([first_value[r, ids[r, c]] for r, c in zip(asked_rows, asked_cols)], dtype=np.int64)
        return {"needle_values": rows * length + cols + 2, "needle_keys": ids[rows, cols],
                "asked": asked_rows * length + asked_cols, "asked_values": ids.reshape(-1)[asked_needles],
                "asked_needles": asked_needles}


def _copy_sources(ids: np.ndarray, positions: np.ndarray, answer: np.ndarray, first: np.ndarray) -> dict:
    """Where each answer copies its tokens from: ``copies [C]`` (flat indices into ``ids [B, L]`` of the positions
    that predict an answer token, the answer's ``</s>`` excepted) and ``copy_sources [C]`` (the flat index of the
    context token each of them predicts: the answer's first occurrence in its row, a needle's value and full stop
    or the repeated sentence). ``positions``, ``answer`` and ``first`` are the batch's arrays of those names."""
    length = ids.shape[1]
    copies, sources = [], []
    starts = np.flatnonzero(first)
    for index in starts:
        end = index
        while end + 1 < len(answer) and answer[end + 1] and positions[end + 1] == positions[end] + 1:
            end += 1
        row, col = divmod(int(positions[index]), length)
        span = ids[row, col + 1 : col + 1 + end - index]  # the answer without its </s>
        windows = np.lib.stride_tricks.sliding_window_view(ids[row, : col + 1], len(span))
        found = np.flatnonzero((windows == span).all(axis=1))
        if len(span) and len(found):
            copies.append(positions[index] + np.arange(len(span)))
            sources.append(row * length + found[0] + np.arange(len(span)))
    empty = np.zeros(0, dtype=np.int64)
    return {"copies": np.concatenate(copies) if copies else empty,
            "copy_sources": np.concatenate(sources) if sources else empty}


def _mixture(weights: dict[str, float]) -> tuple[list[str], np.ndarray]:
    """(task names, their probabilities) of the tasks with a positive weight."""
    tasks = [t for t, w in weights.items() if w > 0]
    p = np.array([weights[t] for t in tasks], dtype=np.float64)
    return tasks, p / p.sum() if tasks else p


def _task_accuracy(batch: dict[str, Any], correct: np.ndarray) -> dict[str, dict[str, float]]:
    """Per task in the batch: accuracy over its answer tokens and over its answers' first tokens (for the needle
    tasks, how often the right needle is chosen), from ``correct [T]`` (bool, argmax == target)."""
    out = {}
    for index in np.unique(batch["task"]):
        mine = batch["task"] == index
        out[list(SPECS)[index]] = {"answer": round(float(correct[mine & batch["answer"]].mean()), 4),
                                   "first": round(float(correct[mine & batch["first"]].mean()), 4)}
    return out


def attention_aux_loss(attention: torch.nn.Module, hidden: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                       head: int, queries: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of query head ``head``'s causal attention at ``queries [N]`` against ``targets [N]``.

    Args:
        attention: a Llama attention module; ``hidden [B, L, D]`` and ``rotary`` (``cos, sin``, each ``[1 or B, L,
            head_dim]``) are its inputs.
        queries, targets: flat indices into ``[B, L]``; each target lies in its query's row, at or before it.
    """
    from transformers.models.llama.modeling_llama import rotate_half

    length, dim = hidden.shape[1], attention.head_dim
    kv_head = head // attention.num_key_value_groups
    rows, cols = queries // length, queries % length
    cos, sin = (r.expand(hidden.shape[0], -1, -1) for r in rotary)
    q = attention.q_proj(hidden[rows, cols])[:, head * dim : (head + 1) * dim]  # [N, d]
    q = q * cos[rows, cols] + rotate_half(q) * sin[rows, cols]
    k = attention.k_proj(hidden)[..., kv_head * dim : (kv_head + 1) * dim]  # [B, L, d]
    k = k * cos + rotate_half(k) * sin
    scores = torch.einsum("nd,nld->nl", q.float(), k[rows].float()) * attention.scaling
    future = torch.arange(length, device=hidden.device) > cols[:, None]
    return F.cross_entropy(scores.masked_fill(future, float("-inf")), targets % length)


def learning_rate(config: TestbedTrainConfig, step: int) -> float:
    """Linear warm-up over `warmup_fraction` of the steps, then cosine decay to ``min_lr_ratio × lr``."""
    warmup = max(1, round(config.warmup_fraction * config.steps))
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, config.steps - warmup)
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _optimizer(modules: list[torch.nn.Module], config: TestbedTrainConfig,
               device: torch.device) -> torch.optim.Optimizer:
    params = [p for module in modules for p in module.parameters()]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def train(config: TestbedTrainConfig, options: RunOptions, command: str | None = None) -> dict[str, Any]:
    """Train (or resume) the testbed model into ``options.output``; export it and evaluate it when training ends.

    Args:
        config: what to train, and on which device.
        options: how the run executes: the folder of the training state, the log and the exported model
            (``config.json``, ``model.safetensors`` in bf16, tokenizer files, ``TRAINING.json``), the steps between
            checkpoints (and key-matching probes in the log), the time limit (a checkpoint is written; rerun to
            resume), the progress bar, the data workers (None: 8 at most on CUDA, none on the CPU).
        command: the command line recorded in ``TRAINING.json``.

    Returns:
        The ``TRAINING.json`` record (``complete`` says whether all steps ran).

    The output folder is locked for the run (`elastic_bench.foundation.files.exclusive`).

    Raises:
        NotImplementedError: ``config.deterministic`` and an operation has no deterministic kernel on the device.
    """
    with exclusive(options.output, command or "elastic-bench testbed train"), \
            deterministic_algorithms(config.deterministic):
        try:
            return _train(config, options, command)
        except RuntimeError as error:
            if config.deterministic and "deterministic" in str(error):
                raise NotImplementedError(
                    f"an operation has no deterministic kernel on this device ({str(error).splitlines()[0]}); "
                    "train with --no-deterministic into a new --output folder"
                ) from error
            raise


def _train(config: TestbedTrainConfig, options: RunOptions, command: str | None) -> dict[str, Any]:
    from transformers import LlamaForCausalLM

    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    vocab = build()
    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(model_config(vocab, config.max_length, config.rope_theta))
    if config.init_from:
        from safetensors.torch import load_file

        weights = Path(config.init_from) / "model.safetensors"
        if not weights.exists():
            raise FileNotFoundError(f"--init-from {config.init_from}: no model.safetensors there")
        model.load_state_dict({k: v.float() for k, v in load_file(weights).items()})
    # The auxiliary head (key_aux_weight, value_aux_weight) trains with the model and is not exported.
    auxiliary = config.key_aux_weight or config.value_aux_weight
    aux = torch.nn.Linear(model.config.hidden_size, len(vocab)) if auxiliary else None
    for module in [model] + ([aux] if aux is not None else []):
        module.to(device)
    objective = TestbedObjective(config, vocab, model, aux, device, options.save_every)
    if options.workers is None:
        options = dataclasses.replace(options, workers=min(8, os.cpu_count() or 1) if device.type == "cuda" else 0)
    model.train()
    run = fit(objective, options, config.steps, fingerprint(dataclasses.asdict(config)), desc="testbed train")
    return finish(model, vocab, config, Path(options.output), run.done, run.seconds, command)


class TestbedObjective(Objective):
    """The testbed objective on the engine: one micro-batch per step (the step's whole batch), the weighted token
    cross-entropy plus the auxiliary losses the configuration weighs; a log record every 25 steps and at the last one
    (with the key-matching probe at checkpoints and at the end).

    Args:
        config: what to train.
        vocab: the testbed vocabulary.
        model: the Llama being trained (on ``device``).
        aux: the auxiliary head of ``key_aux_weight`` / ``value_aux_weight`` (None without them).
        device: where the model is.
        save_every: steps between checkpoints (`RunOptions.save_every`), where the log also probes key matching.
    """

    __test__ = False  # not a pytest class

    def __init__(self, config: TestbedTrainConfig, vocab: Vocab, model, aux: torch.nn.Module | None,
                 device: torch.device, save_every: int):
        self.config, self.vocab, self.model, self.aux, self.device = config, vocab, model, aux, device
        self.save_every = save_every
        self.modules = {"model": model, **({"aux": aux} if aux is not None else {})}
        self.optimizer = _optimizer(list(self.modules.values()), config, device)
        self.batches = Batches(config, vocab)
        self.clipped = list(model.parameters())
        self.grad_clip = config.grad_clip
        self.inputs: dict[int, tuple] = {}  # layer -> (hidden states, rotary) at the attention of a supervised head
        if config.attention_aux_weight:
            for (layer, _), _ in ATTENTION_AUX_HEADS.values():
                model.model.layers[layer].self_attn.register_forward_pre_hook(
                    lambda module, args, kwargs, layer=layer: self.inputs.__setitem__(
                        layer, (kwargs["hidden_states"], kwargs["position_embeddings"])), with_kwargs=True)
        self.last: tuple | None = None

    def learning_rate(self, step: int) -> float:
        return learning_rate(self.config, step)

    def losses(self, step: int, batch: dict[str, Any]) -> Iterator[torch.Tensor]:
        config, device, model, aux = self.config, self.device, self.model, self.aux
        self.last = None
        ids = torch.from_numpy(batch["ids"]).to(device)
        length = ids.shape[1]
        mask = None
        if batch["streaming"]:
            ends = torch.from_numpy(batch["prompt_ends"]) if config.dense_decode else None
            mask = window_mask(length, config.geometry, device, ends)
        positions, targets, weights = (torch.from_numpy(batch[k]).to(device) for k in ("positions", "targets",
                                                                                       "weights"))
        with autocast(device):
            hidden = hidden_states(model, ids, mask)
            logits = model.lm_head(hidden[positions]).float()
        losses = F.cross_entropy(logits, targets, reduction="none")
        loss = (losses * weights).sum() / weights.sum()
        for weight, where, what in ((config.key_aux_weight, "needle_values", "needle_keys"),
                                    (config.value_aux_weight, "asked", "asked_values")):
            if weight and len(batch[where]):
                where_t, what_t = (torch.from_numpy(batch[k]).to(device) for k in (where, what))
                with autocast(device):
                    aux_logits = aux(hidden[where_t]).float()
                loss = loss + weight * F.cross_entropy(aux_logits, what_t)
        attention_losses = {}
        if config.attention_aux_weight and not batch["streaming"]:
            for name, ((layer, head), (where, to)) in ATTENTION_AUX_HEADS.items():
                if len(batch[where]):
                    queries = torch.from_numpy(batch[where]).to(device)
                    attended = torch.from_numpy(batch[to]).to(device) if to else queries - 2
                    with autocast(device):
                        attention_losses[name] = attention_aux_loss(
                            model.model.layers[layer].self_attn, *self.inputs[layer], head, queries, attended)
            loss = loss + config.attention_aux_weight * sum(attention_losses.values())
        self.inputs.clear()
        self.last = (batch, length, logits.detach(), targets, loss.detach(),
                     {k: v.detach() for k, v in attention_losses.items()})
        yield loss

    def record(self, step: int, seconds: float) -> dict[str, Any] | None:
        config, done = self.config, step + 1
        if done % 25 and done != config.steps:
            return None
        batch, length, logits, targets, loss, attention_losses = self.last
        correct = (logits.argmax(-1) == targets).cpu().numpy()
        accuracy = float(correct[batch["answer"]].mean())
        entry = {"length": length, "streaming": batch["streaming"], "loss": round(loss.item(), 4),
                 "answer_token_accuracy": round(accuracy, 4), "tasks": _task_accuracy(batch, correct),
                 "lr": learning_rate(config, step), "seconds": round(seconds, 1),
                 **{f"attention_aux_{k}": round(v.item(), 4) for k, v in attention_losses.items()}}
        if done % self.save_every == 0 or done == config.steps:
            entry["key_matching"] = best_head(key_matching(self.model, self.vocab, min(1024, config.max_length), 8))
        return entry

    def postfix(self, record: dict[str, Any]) -> str:
        return f"len={record['length']} loss={record['loss']:.3f} acc={record['answer_token_accuracy']:.3f}"


def finish(model, vocab: Vocab, config: TestbedTrainConfig, output: Path, steps_done: int, seconds: float,
           command: str | None) -> dict[str, Any]:
    """Export the model (bf16 safetensors + tokenizer), evaluate it, and write ``TRAINING.json`` (with what the
    model was trained on, `Batches.provenance`)."""
    from elastic_bench.results.provenance import provenance

    model.eval()
    device = next(model.parameters()).device
    record: dict[str, Any] = {
        "command": command,
        "seed": config.seed,
        "steps_done": steps_done,
        "complete": steps_done >= config.steps,
        "train_seconds": round(seconds, 1),
        "config": dataclasses.asdict(config),
        "parameters": sum(p.numel() for p in model.parameters()),
        "provenance": Batches(config, vocab).provenance(steps_done),
        **provenance(device),
    }
    if config.eval_samples:
        record["evaluation"] = evaluation = {"samples_per_cell": config.eval_samples, "protocol": "teacher-forced "
                                             "greedy exact match (elastic_bench.testbed.training.evaluate)"}
        for label, geometry in (("full", None), ("streaming", config.geometry)):
            results = exact_match(model, vocab, config.eval_lengths, config.eval_samples, streaming=geometry)
            evaluation[label] = {"tasks": results, "families": family_means(results)}
        evaluation["streaming"]["geometry"] = {"sink": config.streaming[0], "local": config.streaming[1]}
        evaluation["key_matching"] = best_head(key_matching(model, vocab, min(1024, config.max_length)))
    export(model, vocab, output, record)
    return record


def export(model, vocab: Vocab, output: Path, record: dict[str, Any]) -> None:
    """Write the model in bf16 (``config.json``, ``generation_config.json``, ``model.safetensors``), the tokenizer
    and ``TRAINING.json`` into ``output``."""
    import copy

    shipped = copy.deepcopy(model).to(device="cpu", dtype=torch.bfloat16)
    shipped.generation_config.bos_token_id = vocab.bos_id
    shipped.generation_config.eos_token_id = vocab.eos_id
    shipped.generation_config.pad_token_id = vocab.pad_id
    shipped.save_pretrained(output)
    vocab.save_tokenizer(output)
    write_json(output / RECORD, record)
