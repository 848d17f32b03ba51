"""PruLong ("Cache Me If You Can", https://arxiv.org/abs/2506.17121): a learned (L0-gated) mask per KV head in
DuoAttention's gate layout; streaming heads keep sink 128 + window 1024. Its evaluation deploys the masks with
DuoAttention's code, so the prefill deployments are DuoAttention's (see `gates`), with PruLong's chunk size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from elastic_bench.modeling.interface import register_method

from .gates import HeadGates


@register_method("prulong")
@dataclass
class PruLong(HeadGates):
    """PruLong: a learned (L0-gated) gate file in DuoAttention's layout; streaming sink 128 + window 1024. The default
    prefill is one-shot and sparse from the first token: it measures the sparsity the Elastic paper's comparison uses.
    ``prefill="chunked"`` is upstream's deployment (chunks of 32768 tokens up to the last prompt token, which follows
    as a step of its own; the first chunk is dense for every head, so a prompt within one chunk saves nothing).

    No PruLong masks are released upstream: ``pattern`` must be given, or the model directory must ship a
    ``prulong_gates/`` folder (``train-prulong``'s output; 0/1 masks: ``sparsity=None``).
    """

    sparsity: float | None = None
    sink: int = 128
    local: int = 1024
    chunk_size: int = 32768  # PruLong's eval/run_scripts/run_prulong_32k.sh: --duoattn_chunk_prefilling 32768

    model_gates: ClassVar[str] = "prulong_gates"
    duo_patterns: ClassVar[bool] = False
    decoded_prompt_tokens: ClassVar[int] = 1  # eval/model_utils.py prefills input_ids[..., :-1], then generates
