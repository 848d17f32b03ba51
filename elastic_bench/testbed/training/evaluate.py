"""Fast exact-match evaluation of a testbed model, batched and teacher-forced.

A sample counts as correct when, fed ``prompt + answer + </s>``, the model's argmax at every answer position is the
answer token and at the last position ``</s>``: exactly the condition for greedy decoding to produce the answer and
stop. The prompts are those of the registered tasks (`elastic_bench.testbed.tasks`, same seed and index), so these
figures are what ``elastic-bench run --tasks testbed`` measures with its own generation loop, up to numerics (its
containment scoring accepts every exact match, and can accept more). Streaming is evaluated as the harness runs
``get_method("streaming", ...)``: the sink + local-window mask of `elastic_bench.kernels.hybrid.masks.streaming` (token
granularity) over the prompt, dense attention from the answer's positions (the decode steps).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from elastic_bench.kernels import StreamingGeometry
from elastic_bench.kernels.hybrid.masks import streaming as streaming_predicate

from ..generators import SPECS, Generator, sample_rng
from ..vocab import Vocab


def window_mask(length: int, geometry: StreamingGeometry, device: torch.device | str,
                prompt_ends: torch.Tensor | None = None) -> torch.Tensor:
    """``[1, 1, L, L]`` bool mask (True = attend) of causal sink + local-window attention on every head: the 4-D
    ``attention_mask`` transformers models accept as is.

    With ``prompt_ends [B]`` (each row's prompt length) the mask is ``[B, 1, L, L]`` and the positions from a row's
    prompt end on attend causally to every position: a streaming prefill followed by dense decode steps, which is how
    the harness runs a prefill method (decode steps attend the whole cache)."""
    positions = torch.arange(length, device=device)
    mask = streaming_predicate(geometry)(positions[:, None], positions[None, :])[None, None]
    if prompt_ends is None:
        return mask
    decoding = positions[None, :, None] >= prompt_ends.to(device)[:, None, None]  # [B, L, 1]
    return (mask[0] | (decoding & (positions[:, None] >= positions[None, :])))[:, None]


def hidden_states(model, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The last hidden states ``[B · L, hidden]`` of ``ids [B, L]``, flattened, without the LM head."""
    return model.model(input_ids=ids, attention_mask=mask).last_hidden_state.flatten(0, 1)


def answer_logits(model, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Logits ``[T, V]`` (fp32) at flat ``positions`` (indices into ``ids [B, L]`` flattened) only: the LM head is
    applied to those hidden states alone."""
    return model.lm_head(hidden_states(model, ids, mask)[positions]).float()


@torch.no_grad()
def exact_match(
    model,
    vocab: Vocab,
    lengths: list[int],
    num_samples: int,
    seed: int = 42,
    streaming: StreamingGeometry | None = None,
    batch_tokens: int = 65536,
    tasks: list[str] | None = None,
) -> dict[str, dict[str, float]]:
    """Exact-match accuracy in percent, ``{task: {str(length): pct}}`` for every testbed task.

    Args:
        model: a testbed (Llama) causal LM.
        vocab: the testbed vocabulary.
        lengths: target lengths (prompt plus the generation budget), as in `Task.samples`.
        num_samples: samples per task and length (indices ``0 … num_samples-1``).
        seed: sample seed (42 is the harness default).
        streaming: None for full attention, else the sink + window geometry applied to every head of the prompt,
            the answer positions attending densely (as `window_mask` with the prompts' ends).
        batch_tokens: tokens per forward.
        tasks: `generators.SPECS` names to evaluate (default: all).
    """
    device = next(model.parameters()).device
    generator = Generator(vocab)
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=device.type == "cuda")
    results: dict[str, dict[str, float]] = {}
    for name in tasks or list(SPECS):
        spec = SPECS[name]
        results[f"testbed_{name}"] = per_length = {}
        for length in lengths:
            sequences, targets = [], []
            for index in range(num_samples):
                example = generator.example(spec, sample_rng(seed, name, index), length)
                prompt = example.prompt_ids(vocab)
                sequences.append(np.concatenate([prompt, example.answer, [vocab.eos_id]]))
                targets.append(len(prompt))
            width = max(map(len, sequences))
            per_batch = max(1, batch_tokens // width)
            correct = 0
            for start in range(0, num_samples, per_batch):
                chunk = range(start, min(num_samples, start + per_batch))
                ids = torch.full((len(chunk), width), vocab.pad_id, dtype=torch.long)
                flat, gold, owner = [], [], []
                for row, i in enumerate(chunk):
                    seq = sequences[i]
                    ids[row, : len(seq)] = torch.from_numpy(seq)
                    span = np.arange(targets[i], len(seq))  # tokens to predict: the answer and </s>
                    flat.append(row * width + span - 1)
                    gold.append(seq[span])
                    owner.append(np.full(len(span), row))
                flat_t = torch.from_numpy(np.concatenate(flat)).to(device)
                gold_t = torch.from_numpy(np.concatenate(gold)).to(device)
                mask = None if streaming is None else window_mask(
                    width, streaming, device, torch.tensor([targets[i] for i in chunk]))
                with autocast:
                    hits = answer_logits(model, ids.to(device), flat_t, mask).argmax(-1) == gold_t
                misses = torch.zeros(len(chunk), device=device).index_add_(
                    0, torch.from_numpy(np.concatenate(owner)).to(device), (~hits).float()
                )
                correct += int((misses == 0).sum())
            per_length[str(length)] = round(100 * correct / num_samples, 2)
    return results


def family_means(results: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Mean accuracy per family (``sensitive``/``robust``) and length over `exact_match` results."""
    out: dict[str, Any] = {}
    for category in ("sensitive", "robust"):
        names = [f"testbed_{n}" for n, s in SPECS.items() if s.category == category]
        lengths = results[names[0]]
        out[category] = {ln: round(sum(results[n][ln] for n in names) / len(names), 2) for ln in lengths}
    return out
