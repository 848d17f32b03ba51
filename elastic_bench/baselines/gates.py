"""Static head gates, shared by DuoAttention and PruLong: a gate file per model, binarised into a fixed set of
streaming KV heads.

- DuoAttention (Xiao et al., ICLR 2025, https://arxiv.org/abs/2410.10819): one learned gate α per KV head
  (``full_attention_heads.tsv``, rows = layers, columns = KV heads). Binarised by DuoAttention's rule: α clipped to
  [0, 1], plus U(0, 1e-6) tie-breaking noise (seeded), threshold = the ``sparsity`` quantile, retrieval iff
  α ≥ threshold. Streaming heads keep a token-exact sink 64 + window 256 (the README deployment).
- PruLong ("Cache Me If You Can", https://arxiv.org/abs/2506.17121): a gate file in the same layout (0/1 masks, or
  gates binarised by the same quantile rule), streaming heads with sink 128 + window 1024.

A gate file has one row per layer a method plans (`elastic_bench.modeling.attention.attention_modules`: the full
softmax layers, in order; a hybrid model's sliding-window and linear-attention layers have none). The gates are data
files: a trainer's output folder inside the model directory, ``duo_gates/`` for DuoAttention and ``prulong_gates/``
for PruLong (the testbed ships both, made by ``train-duo`` and ``train-prulong``), or the shipped DuoAttention
patterns (Llama-3.1-8B-Instruct, Mistral-7B-Instruct-v0.2, MIT licence, see
``data/duo_attention_patterns/NOTICE.md``) found by model name; any other model needs ``pattern=<dir or tsv>``.

Prefill deployments (``prefill``), each computed in one forward of the prompt:
- ``"one-shot"`` (the default): every streaming head is sparse from the first token, the sparsity the Elastic paper's
  comparison measures.
- ``"chunked"``: upstream's deployment (DuoAttention ``duo_attn/patch/llama.py``, which PruLong's evaluation calls):
  the prompt in chunks of ``chunk_size`` tokens over a cache whose streaming heads keep the first ``sink`` + last
  ``local`` tokens. The first chunk is dense for every head; a later chunk's streaming heads see the sink, the
  ``local`` tokens before the chunk and the chunk. PruLong's evaluation (``eval/model_utils.py``) chunks all but
  the last prompt token, which follows as a step of its own. Since earlier tokens never depend on later ones, one
  forward with that pattern (`StreamingGeometry.chunk_starts`) equals the chunk-by-chunk loop.
- ``"longbench"``: DuoAttention's LongBench evaluation (``eval/LongBench/pred.py``): all but the last 50 prompt tokens
  as the dense first chunk, then those 50 one at a time.
Decode steps of streaming heads see only sink + window, as upstream's compressed cache does: ``local`` tokens with the
query's own after a one-shot prefill; after a chunked one, as upstream's decode step, its ``local`` cached tokens and
itself. Under `elastic_bench.apply`'s default ``kv_cache="evicting"`` the packed KV cache keeps only those tokens of a
streaming head, so its memory is evicted too (``kv_cache="full"`` keeps every token and masks).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import numpy as np
import torch
from torch import nn

from elastic_bench.foundation.files import read_table
from elastic_bench.kernels import HeadPlan, Mode, StreamingGeometry
from elastic_bench.modeling.interface import AttentionCall, Method, SparsityKnob
from elastic_bench.modeling.tensor_parallel import kv_heads

GATES_FILE = "full_attention_heads.tsv"  # DuoAttention's name, inside a pattern folder
SETTINGS_FILE = "config.json"  # what a gate trainer writes beside the gates: its settings and provenance
PATTERNS_DIR = Path(__file__).resolve().parent.parent / "data" / "duo_attention_patterns"


def load_gates(path: str | Path) -> np.ndarray:
    """Gate values ``[layers, kv_heads]`` from a ``full_attention_heads.tsv`` (or a folder holding one).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is empty, not a tab-separated table of numbers, or holds a NaN or infinite gate (the
            message names the file, and the first bad layer and KV head).
    """
    path = Path(path)
    if path.is_dir():
        path = path / GATES_FILE
    if not path.exists():
        raise FileNotFoundError(f"no head-gate file at {path} (expected a full_attention_heads.tsv)")
    gates = read_table(path, "head-gate file", "gates (layers × KV heads)")
    bad = np.argwhere(~np.isfinite(gates))
    if len(bad):
        layer, head = (int(i) for i in bad[0])
        raise ValueError(f"{path} holds a non-finite gate ({gates[layer, head]}) at layer {layer}, KV head {head}; "
                         "every gate must be a finite number")
    return gates


def gate_provenance(path: str | Path) -> dict[str, Any] | None:
    """What the gates at ``path`` (a ``full_attention_heads.tsv`` or a folder holding one) were trained on: the
    ``provenance`` of the ``config.json`` a gate trainer writes beside them (`elastic_bench.training.provenance`),
    checked; None for gates without one (an older trainer's, DuoAttention's released patterns, a hand-made file such
    as the testbed's ablation ``head_ablation.tsv``)."""
    from elastic_bench.training.provenance import check_provenance

    path = Path(path)
    folder = path if path.is_dir() else path.parent
    settings = folder / SETTINGS_FILE
    if (path.is_file() and path.name != GATES_FILE) or not settings.is_file():
        return None
    try:
        recorded = json.loads(settings.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{settings} is not valid JSON ({err}); it may be truncated or corrupt") from None
    return check_provenance(recorded.get("provenance") if isinstance(recorded, dict) else None, str(settings))


def _check_shape(path: Path, gates: np.ndarray, expected: tuple[int, int]) -> None:
    if gates.shape != expected:
        raise ValueError(f"head gates in {path} are {gates.shape[0]} layers × {gates.shape[1]} KV heads; the model has "
                         f"{expected[0]} layers × {expected[1]} KV heads (one gate row per full-attention layer; "
                         "sliding-window and linear-attention layers have none)")


def binarize(gates: np.ndarray, sparsity: float | None, seed: int = 0) -> np.ndarray:
    """DuoAttention's ``sparsify_attention_heads``: True = retrieval (FULL) head.

    With ``sparsity`` (fraction of streaming heads, a global quantile over all layers) ties are broken by seeded
    U(0, 1e-6) noise; without it, a head is retrieval iff its gate is ≥ 0.5.
    """
    gates = np.clip(gates, 0.0, 1.0)
    if sparsity is None:
        return gates >= 0.5
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity must lie in [0, 1], got {sparsity}")
    noisy = gates + np.random.default_rng(seed).uniform(0, 1e-6, gates.shape)
    return noisy >= np.quantile(noisy, sparsity)


Prefill = Literal["one-shot", "chunked", "longbench"]
LONGBENCH_DECODED = 50  # DuoAttention's eval/LongBench/pred.py: --decoding_simulation_length 50


def prefill_chunk_starts(length: int, chunk_size: int, decoded: int) -> tuple[int, ...]:
    """Chunk starts (`StreamingGeometry.chunk_starts`) of a ``length``-token prompt prefilled in chunks of
    ``chunk_size`` tokens up to its last ``decoded`` tokens, which follow one at a time (the first chunk keeps at
    least one token)."""
    head = max(length - decoded, 1)
    return (*range(0, head, chunk_size), *range(head, length))


def shipped_pattern(source: str, folder: str, duo_patterns: bool = True) -> Path:
    """The gates shipped with the model at ``source`` (its folder or hub id): the gate folder ``<model dir>/<folder>``
    (a trainer's output: ``full_attention_heads.tsv``, its ``config.json`` and log), else (with ``duo_patterns``) the
    shipped DuoAttention pattern whose model name matches, else a clear error."""

    def norm(name: str) -> str:
        return re.sub(r"^meta-", "", Path(name).name.lower())

    if source and (Path(source) / folder / GATES_FILE).exists():
        return Path(source) / folder
    shipped = sorted(p.name for p in PATTERNS_DIR.iterdir() if p.is_dir()) if duo_patterns else []
    for candidate in shipped:
        if norm(candidate) == norm(source):
            return PATTERNS_DIR / candidate
    raise FileNotFoundError(
        f"no head gates shipped for model {norm(source) or '(unnamed)'!r} (no {folder}/{GATES_FILE} in its directory"
        + (f"; DuoAttention patterns: {', '.join(shipped)}" if shipped else "")
        + "); pass pattern=<folder or full_attention_heads.tsv>"
    )


@dataclass
class HeadGates(Method):
    """Retrieval heads FULL, the other KV heads streaming (static, from a learned gate file).

    Args:
        pattern: folder or TSV of gates (e.g. the output folder of ``train-duo`` / ``train-prulong``); ``"auto"``:
            the gate folder the model directory ships for the method (``duo_gates/``, ``prulong_gates/``), else
            (``duo_attention`` only) a shipped DuoAttention pattern matching the model name.
        sparsity: fraction of KV heads made streaming (global quantile); None thresholds the gates at 0.5.
        seed: seed of the tie-breaking noise.
        sink: streaming sink tokens.
        local: streaming window tokens (the query's own token included); in a chunked prefill, the tokens kept
            before the chunk (upstream's ``recent_size``).
        sparse_decode: decode steps of streaming heads see only sink + window (upstream's compressed cache).
        prefill: ``"one-shot"`` (sparse from the first token), ``"chunked"`` (upstream's deployment: a dense first
            chunk, then sink + ``local`` + the chunk) or ``"longbench"`` (DuoAttention's LongBench evaluation: all but
            the last 50 prompt tokens dense, then one at a time).
        chunk_size: prefill chunk length of ``prefill="chunked"``.
    """

    pattern: str = "auto"
    sparsity: float | None = 0.5
    seed: int = 0
    sink: int = 64
    local: int = 256
    sparse_decode: bool = True
    prefill: Prefill = "one-shot"
    chunk_size: int = 32000  # DuoAttention's scripts/niah.sh and scripts/efficiency.sh: --prefilling_chunk_size 32000

    # the share of streaming heads, then their window (a head's step of sparsity can be coarser than a budget's
    # tolerance on a model with few heads)
    knobs = (SparsityKnob("sparsity", "higher", low=0.0, high=1.0), SparsityKnob("local", "lower", low=1, integer=True))
    model_gates: ClassVar[str] = "duo_gates"  # the gate folder "auto" looks for in the model directory
    duo_patterns: ClassVar[bool] = True  # whether "auto" may take a shipped DuoAttention pattern
    decoded_prompt_tokens: ClassVar[int] = 0  # last prompt tokens upstream's chunked evaluation feeds one at a time

    def __post_init__(self):
        if self.sparsity is not None and not 0.0 <= self.sparsity <= 1.0:  # NaN fails too
            raise ValueError(f"{self.name}.sparsity must lie in [0, 1] (or be None), got {self.sparsity}")
        if self.seed < 0:
            raise ValueError(f"{self.name}.seed must be >= 0, got {self.seed}")
        if self.sink < 0:
            raise ValueError(f"{self.name}.sink must be >= 0, got {self.sink}")
        if self.local < 1:
            raise ValueError(f"{self.name}.local must be >= 1, got {self.local}")
        if self.prefill not in get_args(Prefill):
            raise ValueError(f"{self.name}.prefill must be one of {', '.join(get_args(Prefill))}, got {self.prefill!r}")
        if self.chunk_size < 1:
            raise ValueError(f"{self.name}.chunk_size must be >= 1, got {self.chunk_size}")
        if self.pattern != "auto" and not Path(self.pattern).exists():
            raise FileNotFoundError(f"{self.name}.pattern: no file or folder at {self.pattern} (expected a "
                                    "full_attention_heads.tsv or a folder holding one, or 'auto')")
        # read and checked once, before any model loads; `setup` (every cell) reuses them
        self._gates = (Path(self.pattern), load_gates(self.pattern)) if self.pattern != "auto" else None

    def gate_file(self, model_dir: str) -> Path:
        """The gate file (or folder) this method loads for the model at ``model_dir`` (``pattern``, or for ``"auto"``
        the gates shipped with the model)."""
        if self.pattern == "auto":
            return shipped_pattern(model_dir, self.model_gates, self.duo_patterns)
        return Path(self.pattern)

    def artifacts(self, model_dir: str) -> dict[str, Path]:
        return {"pattern": self.gate_file(model_dir)}

    def hold(self, name: str, path: Path, folder: Path) -> Path:
        """A copy of the gate file alone (a folder's ``full_attention_heads.tsv``): a trainer's log, configuration or
        resume state beside it changes no gate."""
        return super().hold(name, path / GATES_FILE if path.is_dir() else path, folder)

    def provenance(self, name: str, path: Path) -> dict[str, Any] | None:
        """The gate trainer's record beside the gate file (`gate_provenance`)."""
        return gate_provenance(path)

    def check_model(self, config) -> None:
        """Refuse gates whose table is not the model's planned layers × KV heads (of its transformers ``config``)."""
        from elastic_bench.modeling.layer_kinds import layer_kinds, text_config

        path, gates = self._loaded(getattr(config, "_name_or_path", "") or "")
        text = text_config(config)
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        _check_shape(path, gates, (sum(kind.routable for kind in layer_kinds(config)), heads))

    def _loaded(self, model_dir: str) -> tuple[Path, np.ndarray]:
        """The gate file for the model at ``model_dir`` and its gates, read once."""
        path = self.gate_file(model_dir)
        if self._gates is None or self._gates[0] != path:
            self._gates = (path, load_gates(path))
        return self._gates

    def setup(self, model: nn.Module) -> None:
        from elastic_bench.modeling.attention import attention_modules

        path, gates = self._loaded(getattr(model.config, "_name_or_path", "") or "")
        modules = attention_modules(model)
        _check_shape(path, gates, (len(modules), model.config.num_key_value_heads))
        retrieval = binarize(gates, self.sparsity, self.seed)
        self._modes = torch.from_numpy(np.where(retrieval, int(Mode.FULL), int(Mode.STREAMING)).astype(np.uint8))
        self._layer_row = {m.layer_idx: i for i, m in enumerate(modules)}
        self._geometry = StreamingGeometry(self.sink, self.local)

    def prefill_plan(self, call: AttentionCall) -> HeadPlan:
        """The gates' modes under the ``prefill`` deployment; a chunked one is planned on the call's keys as a whole
        prompt, so a caller-fed chunk continues the same chunk grid (``"chunked"``, DuoAttention)."""
        return self._plan(call, self.prefill_geometry(call.key.shape[2]))

    def decode_plan(self, call: AttentionCall) -> HeadPlan:
        if not self.sparse_decode:
            return super().decode_plan(call)
        chunked = self.prefill != "one-shot"  # upstream's decode step: `local` cached tokens and the query
        return self._plan(call, replace(self._geometry, local=self.local + 1) if chunked else self._geometry)

    def prefill_geometry(self, length: int) -> StreamingGeometry:
        """The streaming geometry of a ``length``-token prefill under the ``prefill`` deployment."""
        if self.prefill == "one-shot":
            return self._geometry
        if self.prefill == "chunked":
            starts = prefill_chunk_starts(length, self.chunk_size, self.decoded_prompt_tokens)
        else:  # longbench: one dense chunk, then the last tokens one at a time
            starts = prefill_chunk_starts(length, length, LONGBENCH_DECODED)
        return replace(self._geometry, chunk_starts=starts)

    def _plan(self, call: AttentionCall, geometry: StreamingGeometry) -> HeadPlan:
        # host modes (no device synchronisation) of the KV heads the call holds (this rank's under tensor parallelism)
        row = self._modes[self._layer_row[call.layer_idx], kv_heads(call.module)]
        return HeadPlan(row.expand(call.batch_size, -1), geometry)

    def extra_stats(self) -> dict[str, float]:
        return {"realised_head_sparsity": float((self._modes == Mode.STREAMING).double().mean())}
