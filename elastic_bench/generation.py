"""Greedy generation with a timed one-shot prefill (time to first token), one prompt at a time."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass
class Generation:
    tokens: list[int]
    prefill_seconds: float
    decode_seconds: float


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def greedy_generate(
    model, input_ids: list[int], max_new_tokens: int, stop_ids: set[int], min_new_tokens: int = 0
) -> Generation:
    """Greedy decoding of one prompt.

    The prompt is prefilled in one forward (``logits_to_keep=1``), timed with a device synchronisation on both
    sides; decode steps reuse the KV cache. Generation stops at a token of ``stop_ids`` (not returned) once
    ``min_new_tokens`` tokens exist; before that, stop tokens are masked out.
    """
    from transformers import DynamicCache

    device = next(model.parameters()).device
    cache = DynamicCache()
    ids = torch.tensor([input_ids], device=device)
    stop = torch.tensor(sorted(stop_ids), device=device, dtype=torch.long)
    _sync(device)
    start = time.perf_counter()
    logits = model(ids, None, None, cache, use_cache=True, logits_to_keep=1).logits[:, -1]
    _sync(device)
    prefill = time.perf_counter() - start
    tokens: list[int] = []
    for step in range(max_new_tokens):
        if step < min_new_tokens and stop.numel():
            logits[:, stop] = float("-inf")
        token = logits.argmax(-1)
        if int(token) in stop_ids:
            break
        tokens.append(int(token))
        if step + 1 < max_new_tokens:
            logits = model(token[:, None], None, None, cache, use_cache=True).logits[:, -1]
    _sync(device)
    return Generation(tokens, prefill, time.perf_counter() - start - prefill)
