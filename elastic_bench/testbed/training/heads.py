"""Retrieval heads of the testbed model, found by ablation (the static head gates DuoAttention and PruLong need), and
the key-matching probe (whether a model has learned to find a needle by its key).

These gates are not DuoAttention's or PruLong's optimisation: each KV head alone is switched to
streaming attention (every other head stays full) and the drop of exact match on ``niah_single`` (the sensitive task
the shipped model solves) is its gate: 1 for a head the task cannot do without, 0 for one it never needs. The gates
are written in DuoAttention's layout (a TSV of ``layers × KV heads``), so ``-O duo_attention.pattern=FILE`` and
``-O prulong.pattern=FILE`` use them. This is the ablation view of retrieval heads (Wu et al., "Retrieval Head
Mechanistically Explains Long-Context Factuality", https://arxiv.org/abs/2404.15574), not DuoAttention's gate training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from elastic_bench.kernels import HeadPlan, Mode, StreamingGeometry
from elastic_bench.modeling.attention import apply, attention_implementation
from elastic_bench.modeling.interface import AttentionCall, Method

from .. import STREAMING_LOCAL, STREAMING_SINK
from ..generators import SPECS, Generator, sample_rng
from ..vocab import Vocab
from .evaluate import exact_match


@dataclass
class OneHeadStreaming(Method):
    """KV head ``head`` of layer ``layer`` streams (sink + window); every other head is full. Not registered."""

    layer: int = 0
    head: int = 0
    sink: int = STREAMING_SINK
    local: int = STREAMING_LOCAL

    def prefill_plan(self, call: AttentionCall) -> HeadPlan:
        modes = torch.full((call.batch_size, call.num_kv_heads), int(Mode.FULL), dtype=torch.uint8)
        if call.layer_idx == self.layer:
            modes[:, self.head] = int(Mode.STREAMING)
        return HeadPlan(modes.to(call.query.device), StreamingGeometry(self.sink, self.local))


def ablation_gates(model, vocab: Vocab, length: int = 2048, samples: int = 20,
                   tasks: tuple[str, ...] = ("niah_single", "niah_multikey"), progress: bool = True) -> np.ndarray:
    """``[layers, KV heads]`` gates in [0, 1]: the largest relative drop of exact match at ``length`` tokens over
    ``tasks`` (`generators.SPECS` names; by default the sensitive family) when that head alone streams with the
    testbed's sink + window (`elastic_bench.testbed.STREAMING_SINK`, `STREAMING_LOCAL`). Tasks the model fails with
    full attention are left out.

    Raises:
        ValueError: the model solves none of ``tasks`` with full attention.
    """
    def scores() -> dict[str, float]:
        found = exact_match(model, vocab, [length], samples, tasks=list(tasks))
        return {task: per_length[str(length)] for task, per_length in found.items()}

    full = {task: score for task, score in scores().items() if score > 0}
    if not full:
        raise ValueError(f"the model solves none of {list(tasks)} with full attention; no head is a retrieval head")
    config = model.config
    gates = np.zeros((config.num_hidden_layers, config.num_key_value_heads))
    cells = [(layer, head) for layer in range(gates.shape[0]) for head in range(gates.shape[1])]
    for layer, head in tqdm(cells, desc="head ablation", disable=not progress):
        with apply(OneHeadStreaming(layer, head), model, backend="reference"):
            ablated = scores()
        gates[layer, head] = max(max(0.0, full[t] - ablated[t]) / full[t] for t in full)
    return gates


def write_gates(gates: np.ndarray, path: str | Path) -> None:
    """Write ``gates [layers, KV heads]`` as DuoAttention's tab-separated ``full_attention_heads.tsv`` layout."""
    np.savetxt(path, gates, delimiter="\t", fmt="%.4f")


@torch.no_grad()
def key_matching(model, vocab: Vocab, length: int = 1024, samples: int = 16, seed: int = 42) -> np.ndarray:
    """``[layers, query heads]`` key-matching selectivity on ``niah_multikey`` prompts of ``length`` tokens: at the
    question's key token, the attention mass on the queried needle (its key up to its full stop) minus the mean mass
    on each distractor needle, averaged over ``samples`` prompts (those of the registered task, same seed).

    A model that retrieves by key has a head near 1 (the shipped checkpoint: layer 3, query heads 1 and 3, 0.97 and
    0.91 at 1K); a model that picks a needle by position has none (docs/testbed.md). The
    attention is computed eagerly, in fp32 on the model's device; the model's attention implementation and mode are
    restored afterwards.
    """
    config, generator, device = model.config, Generator(vocab), next(model.parameters()).device
    key_ids, dot = set(int(k) for k in vocab.key_ids), generator.dot
    training = model.training
    out = np.zeros((config.num_hidden_layers, config.num_attention_heads))
    model.eval()
    try:
        with attention_implementation(model, "eager"):
            for index in range(samples):
                example = generator.example(SPECS["niah_multikey"], sample_rng(seed, "niah_multikey", index), length)
                prompt = example.prompt_ids(vocab)
                text_end = 1 + len(example.instruction) + len(example.context)
                # the question's key
                asked = text_end + int(np.flatnonzero(np.isin(example.question, vocab.key_ids))[0])
                with torch.autocast(device.type, enabled=False):
                    attentions = model(torch.from_numpy(prompt)[None].to(device), output_attentions=True).attentions
                needles = [j for j in range(text_end) if int(prompt[j]) in key_ids]
                for layer, weights in enumerate(attentions):
                    row = weights[0, :, asked].float().cpu().numpy()  # [heads, L]
                    for j in needles:
                        stop = j + int(np.flatnonzero(prompt[j:] == dot)[0]) + 1
                        mass = row[:, j:stop].sum(-1)
                        out[layer] += mass if prompt[j] == prompt[asked] else -mass / (len(needles) - 1)
    finally:
        model.train(training)
    return out / samples


def best_head(selectivity: np.ndarray) -> dict[str, float | int]:
    """``{"selectivity", "layer", "head"}`` of the most selective query head of a `key_matching` result."""
    layer, head = np.unravel_index(int(selectivity.argmax()), selectivity.shape)
    return {"selectivity": round(float(selectivity[layer, head]), 4), "layer": int(layer), "head": int(head)}
