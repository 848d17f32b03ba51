"""Reference decode attention over a packed cache (gather each row's slots, mask the invisible ones, softmax), and the
reference of writing a decode token into it."""

from __future__ import annotations

import torch


def naive_decode_attention(q: torch.Tensor, kv, scale: float) -> torch.Tensor:
    """``q [R, G, D]`` (the G query heads of each row) over `PackedKV` ``kv`` → ``[R, G, D]`` in ``q.dtype``;
    computed in fp32."""
    R = kv.num_rows
    span = torch.arange(max(kv.max_slots, 1), device=q.device)
    index = (kv.offsets[:, None] + span[None]).clamp(max=kv.keys.shape[0] - 1)  # [R, S]
    inside = span[None] < kv.slots[:, None]
    pos = kv.positions[index]
    visible = inside & (pos >= 0) & ((pos >= kv.window_start[:, None]) | (pos < kv.sink_end[:, None]))
    hidden = ~visible[..., None]  # what an invisible slot holds never reaches the output (not even a NaN)
    keys = kv.keys[index].float().masked_fill(hidden, 0.0)  # [R, S, D]
    values = kv.values[index].float().masked_fill(hidden, 0.0)
    scores = torch.einsum("rgd,rsd->rgs", q.float(), keys) * scale
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row without a visible slot gives zeros
    return torch.einsum("rgs,rsd->rgd", weights, values).to(q.dtype).reshape(R, -1, q.shape[-1])


def naive_append_token(kv, key: torch.Tensor, value: torch.Tensor, newest: torch.Tensor, rule) -> None:
    """Write one new token per row into `PackedKV` ``kv`` by `AppendRule` ``rule`` (see `append_token`); torch
    operations on any device."""
    newest.add_(1)
    pos = newest
    wrap = rule.ring & (pos >= rule.ring_sink)
    slot = kv.offsets + torch.where(wrap, rule.ring_sink + (pos - rule.ring_sink) % rule.ring_span, pos)
    kv.keys.index_copy_(0, slot, key)
    kv.values.index_copy_(0, slot, value)
    kv.positions.index_copy_(0, slot, pos)
    window = (pos.div(rule.quantum, rounding_mode="floor") - rule.back) * rule.quantum
    kv.window_start.copy_(torch.where(rule.streaming, window, 0))
