"""Router checkpoints: ``router.safetensors`` + ``router_config.json``, and the released Hugging Face checkpoints.

Design decisions:
- One key naming for every source: ``model.layers.{i}.self_attn.mask_allocator.<param>``, the naming of the released
  checkpoints (``LCM-Lab/elastic-attention``), so our files and theirs load through the same code.
- ``router_config.json`` records what a router needs to be used again: the base model, its layout (layers, KV heads,
  head_dim), the router architecture, the meaning of the two sides (`ModeConfig`) and the training hyper-parameters.
- A released model directory (``config.json`` + ``*.safetensors``) is read for its ``mask_allocator`` tensors only,
  and its config keys are mapped: ``retrieval_mode``/``toggle_type`` → mode, ``sink_size``, ``local_window_size``
  (code default 1024 when absent), ``block_size``, ``use_softmax`` → number of logits, and ``xattn_threshold`` /
  ``xattn_stride`` (the keys FastDeploy reads) → ``xa_threshold`` / ``xa_stride``. Without ``xattn_threshold``
  elastic-bench uses the paper's τ 0.9 (the official evaluation code ran 0.8, `OFFICIAL_XA_THRESHOLD`); an
  ``xa_threshold`` override wins over either.
- A checkpoint is checked as data before any router is built: its ``format_version`` (1), every config number within
  `BOUNDS` and every attention field of its type and within `ATTENTION_BOUNDS`, the tensors of every layer and only
  those, each of the shape the config implies, every value finite. A bad file is one ValueError naming the file, its
  first bad field and the valid range. The ``training`` record is the trainer's, read as it is.
- Writes are atomic (`elastic_bench.foundation.files.atomic_path`).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from elastic_bench.foundation.options import check_fields, check_value

from .modes import ModeConfig
from .router import AttentionRouter, Pooling

CONFIG_FILE = "router_config.json"
WEIGHTS_FILE = "router.safetensors"
FORMAT_VERSION = 1
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.self_attn\.mask_allocator\.(.+)$")
_HF_MODES = {("full", "streaming"): "fa-ssa", ("full", "xattn"): "fa-xa", ("xattn", "streaming"): "xa-ssa"}
BOUNDS = {"num_layers": (1, 1024), "num_kv_heads": (1, 1024), "head_dim": (1, 1024), "hidden_mult": (1, 64),
          "num_logits": (1, 2), "pool_tokens": (1, 1 << 20)}
"""Inclusive bounds of a router config's numbers, checked before anything is built: beyond every released model's
layers, KV heads and head width, and the paper's hidden widths (2 to 8 times the head's)."""
ATTENTION_BOUNDS = {"sink": (0, 1 << 20), "local": (1, 1 << 22), "block_size": (1, 1024), "xa_stride": (1, 1024),
                    "xa_threshold": (0.0, 1.0)}
"""Inclusive bounds of the attention fields (`ModeConfig`): windows of up to 4M tokens, blocks of up to 1024 tokens
(the kernels' are 64 or 128), a threshold that is a fraction; ``xa_stride`` must also divide ``block_size``."""


@dataclass
class RouterConfig:
    """Everything needed to rebuild and apply a set of routers.

    Attributes:
        num_layers, num_kv_heads, head_dim: the base model's layout (one router per routed layer, 2 logits per KV
            head; ``head_dim`` the key width).
        layer_ids: the ``layer_idx`` of each routed layer, in order, where they are not ``0 … num_layers − 1`` (a
            hybrid model routes its full-attention layers only); None: every layer.
        base_model: the model spec or path the routers were trained on (informational).
        hidden_mult, num_logits, pooling, pool_tokens: `AttentionRouter` arguments.
        attention: what the router's full and sparse sides mean (`ModeConfig`).
        training: training hyper-parameters and targets, as recorded by the trainer.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    layer_ids: list[int] | None = None
    base_model: str = ""
    hidden_mult: int = 4
    num_logits: int = 2
    pooling: Pooling = "boundary"
    pool_tokens: int = 100
    center_features: bool = False
    attention: ModeConfig = field(default_factory=ModeConfig)
    training: dict[str, Any] = field(default_factory=dict)

    def layout(self) -> str:
        layers = "" if self.layer_ids is None else f" (layers {', '.join(map(str, self.layer_ids))})"
        return f"{self.num_layers} layers{layers} × {self.num_kv_heads} KV heads × head_dim {self.head_dim}"

    @property
    def routed_layers(self) -> list[int]:
        """The ``layer_idx`` of each router's layer."""
        return list(range(self.num_layers)) if self.layer_ids is None else list(self.layer_ids)

    def build(self) -> RouterBank:
        """Fresh routers (N(0, 0.02) weights) for this configuration."""
        return RouterBank(self)

    def to_dict(self) -> dict[str, Any]:
        """The config as ``router_config.json`` holds it; ``layer_ids`` only where set (a file of routers over every
        layer reads as before)."""
        data = {"format_version": FORMAT_VERSION, **asdict(self), "attention": self.attention.to_dict()}
        if self.layer_ids is None:
            del data["layer_ids"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RouterConfig:
        data = dict(data)
        data.pop("format_version", None)
        valid = {f.name for f in fields(cls)}
        unknown = set(data) - valid
        if unknown:
            raise ValueError(f"unknown router config keys {sorted(unknown)}; valid keys: {sorted(valid)}")
        data["attention"] = ModeConfig(**data.get("attention", {}))
        return cls(**data)


class RouterBank(torch.nn.Module):
    """One `AttentionRouter` per routed layer: ``bank[layer_idx]``; ``bank.layers`` in layer order."""

    def __init__(self, config: RouterConfig):
        super().__init__()
        self.config = config
        self.layers = torch.nn.ModuleList(_router(config) for _ in range(config.num_layers))
        self.position = {layer: i for i, layer in enumerate(config.routed_layers)}  # layer_idx -> index in `layers`

    def __getitem__(self, layer_idx: int) -> AttentionRouter:
        return self.layers[self.position[layer_idx]]

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters under the released checkpoints' names, ``model.layers.{layer_idx}.self_attn.mask_allocator.*``."""
        return {
            f"model.layers.{i}.self_attn.mask_allocator.{name}": p.detach().float().cpu().contiguous()
            for i, router in zip(self.config.routed_layers, self.layers)
            for name, p in router.state_dict().items()
        }

    def load_hf_state_dict(self, tensors: dict[str, torch.Tensor], source: str) -> None:
        """Load parameters named as in `hf_state_dict` (other keys are ignored); every router must be complete
        (`_check_tensors`)."""
        per_layer = _check_tensors(self.config, tensors, source)
        for i, router in zip(self.config.routed_layers, self.layers):
            router.load_state_dict({k: v.float() for k, v in per_layer[i].items()})


def _router(config: RouterConfig) -> AttentionRouter:
    return AttentionRouter(config.head_dim, config.hidden_mult, config.num_logits, config.pooling, config.pool_tokens,
                           config.num_kv_heads if config.center_features else None)


def _check_tensors(config: RouterConfig, tensors: dict[str, torch.Tensor], source: str
                  ) -> dict[int, dict[str, torch.Tensor]]:
    """The router tensors of ``tensors`` by layer, checked against ``config`` without building a router: one router per
    routed layer (``0..num_layers-1``, or ``layer_ids``), each with exactly the parameters and shapes of
    `AttentionRouter` (a router built on the meta device gives them).

    Raises:
        ValueError: a layer missing or extra, a parameter missing, extra or of another shape (the first, named).
    """
    per_layer: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        match = _KEY.search(key)
        if match:
            per_layer.setdefault(int(match.group(1)), {})[match.group(2)] = value
    if config.layer_ids is not None and len(config.layer_ids) != config.num_layers:
        raise ValueError(f"{source}: layer_ids names {len(config.layer_ids)} layers, num_layers is {config.num_layers}")
    if sorted(per_layer) != config.routed_layers:
        raise ValueError(f"{source} holds routers for layers {sorted(per_layer)}; expected layers "
                         f"{config.routed_layers if config.layer_ids else f'0..{config.num_layers - 1}'}")
    with torch.device("meta"):
        expected = {name: tuple(p.shape) for name, p in _router(config).state_dict().items()}
    for i in config.routed_layers:
        for name in sorted(expected.keys() | per_layer[i].keys()):
            found = tuple(per_layer[i][name].shape) if name in per_layer[i] else None
            if found != expected.get(name):
                raise ValueError(f"{source}: layer {i} router does not match {config.layout()}: {name} is "
                                 f"{'missing' if found is None else list(found)}, expected "
                                 f"{list(expected[name]) if name in expected else 'no such tensor'}")
    return per_layer


def save_routers(bank: RouterBank, directory: str | Path) -> Path:
    """Write ``router.safetensors`` and ``router_config.json`` into ``directory`` (created), each atomically; returns
    it."""
    from safetensors.torch import save_file

    from elastic_bench.foundation.files import atomic_path, write_text

    directory = Path(directory)
    with atomic_path(directory / WEIGHTS_FILE) as tmp:
        save_file(bank.hf_state_dict(), str(tmp), metadata={"format": "pt"})
    write_text(directory / CONFIG_FILE, json.dumps(bank.config.to_dict(), indent=2) + "\n")
    return directory


def load_routers(path: str | Path, **overrides: Any) -> RouterBank:
    """Load routers from an elastic-bench checkpoint directory or a released model directory.

    Args:
        path: a directory with ``router_config.json`` + ``router.safetensors``, or a Hugging Face model directory whose
            ``*.safetensors`` hold ``mask_allocator`` tensors.
        overrides: `ModeConfig` fields that replace the checkpoint's (e.g. ``xa_threshold=0.8``).

    Returns:
        A `RouterBank` on the CPU, with its `RouterConfig` in ``bank.config``.

    Raises:
        FileNotFoundError, ValueError: as `check_router_dir`.
    """
    config, tensors = _read_checkpoint(Path(path))
    if overrides:
        config.attention = ModeConfig(**{**config.attention.to_dict(), **overrides})
    bank = RouterBank(config)
    bank.load_hf_state_dict(tensors, str(path))
    return bank


def read_provenance(path: str | Path) -> dict[str, Any] | None:
    """What the routers at ``path`` were trained on: ``training.provenance`` of its ``router_config.json``
    (`elastic_bench.training.provenance`), checked; None for a checkpoint that records none (an older one, a released
    model's folder)."""
    from elastic_bench.training.provenance import check_provenance

    file = Path(path) / CONFIG_FILE
    if not file.exists():
        return None
    training = _read_json(file).get("training")
    return check_provenance(training.get("provenance") if isinstance(training, dict) else None, str(file))


def check_router_dir(path: str | Path) -> Path:
    """``path`` as a `Path`, checked to be a router checkpoint `load_routers` loads, without building a router or
    loading a model: its config read and within `BOUNDS`, its tensors read and of the config's layers and shapes,
    every value finite.

    Raises:
        FileNotFoundError: ``path`` is not a directory, holds neither ``router_config.json`` nor the ``config.json`` of
            a released model, or lacks its weights.
        ValueError: a file that is not what it should be (one line naming the file and its first bad entry).
    """
    _read_checkpoint(Path(path))
    return Path(path)


def _read_checkpoint(path: Path) -> tuple[RouterConfig, dict[str, torch.Tensor]]:
    """The checked `RouterConfig` and router tensors of checkpoint directory ``path`` (see `check_router_dir`)."""
    if not path.is_dir():
        raise FileNotFoundError(f"router checkpoint {path} is not a directory")
    if (path / CONFIG_FILE).exists():
        file = path / CONFIG_FILE
        data = _read_json(file)
        _check_attention(data.get("attention", {}), file)
        check_fields(RouterConfig, {k: v for k, v in data.items() if k != "format_version"}, str(file))
        try:
            config = RouterConfig.from_dict(data)
        except TypeError as err:  # a required key missing
            raise ValueError(f"{file} is not a router config written by elastic-bench: {err}") from None
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{file}: format_version must be {FORMAT_VERSION}, got {data.get('format_version')!r} "
                             "(a router config of another elastic-bench format)")
        _check_bounds(config, file)
        tensors = _read_router_tensors([path / WEIGHTS_FILE], str(path))
    elif (path / "config.json").exists():
        file = path / "config.json"
        tensors = _read_router_tensors(sorted(path.glob("*.safetensors")), str(path))
        hf = _read_json(file)
        _check_attention({key: hf[name] for name, key in _HF_ATTENTION.items() if name in hf}, file, _HF_ATTENTION)
        try:
            config = _config_from_hf(hf, tensors, str(path))
        except (KeyError, TypeError, AttributeError, ZeroDivisionError) as err:
            raise ValueError(f"{file} is not a released Elastic Attention model config "
                             f"({type(err).__name__}: {err})") from None
        _check_bounds(config, file)
    else:
        raise FileNotFoundError(f"{path} holds neither {CONFIG_FILE} (elastic-bench) nor config.json (released model)")
    _check_tensors(config, tensors, str(path))
    return config, tensors


_HF_ATTENTION = {"sink_size": "sink", "local_window_size": "local", "block_size": "block_size",
                 "xattn_stride": "xa_stride", "xattn_threshold": "xa_threshold"}  # a released config's names


def _check_attention(attention: Any, file: Path, names: dict[str, str] | None = None) -> None:
    """Refuse attention fields (`ModeConfig`'s, as a mapping) of the wrong type or outside `ATTENTION_BOUNDS`, in one
    line naming ``file``, the field (``attention.<field>``, or its name in ``file`` by ``names``) and what is valid."""
    shown = {key: name for name, key in (names or {}).items()}
    if not isinstance(attention, dict):
        raise ValueError(f"{file}: attention must be a JSON object of {', '.join(f.name for f in fields(ModeConfig))}, "
                         f"got {attention!r}")
    for key, value in attention.items():
        field_name = shown.get(key, f"attention.{key}")
        if key not in {f.name for f in fields(ModeConfig)}:
            raise ValueError(f"{file}: unknown key {field_name}; valid: "
                             f"{', '.join(f'attention.{f.name}' for f in fields(ModeConfig))}")
        check_value(ModeConfig, key, value, f"{file}: {field_name}")
        if key in ATTENTION_BOUNDS:
            low, high = ATTENTION_BOUNDS[key]
            if not low <= value <= high:
                raise ValueError(f"{file}: {field_name} must lie in [{low}, {high}], got {value!r}")
    block, stride = attention.get("block_size", ModeConfig.block_size), attention.get("xa_stride", ModeConfig.xa_stride)
    if block % stride:
        raise ValueError(f"{file}: {shown.get('xa_stride', 'attention.xa_stride')} ({stride}) must divide "
                         f"{shown.get('block_size', 'attention.block_size')} ({block})")


def _check_bounds(config: RouterConfig, file: Path) -> None:
    """Refuse a config number outside `BOUNDS` (one line naming ``file`` and the first such key)."""
    for key, (low, high) in BOUNDS.items():
        value = getattr(config, key)
        if not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{file}: {key} must lie in [{low}, {high}], got {value!r}")


def _read_json(file: Path) -> dict[str, Any]:
    """A JSON object from ``file``; a file that is not one raises ValueError naming it."""
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{file} is not valid JSON ({err}); it may be truncated or corrupt") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file} must hold a JSON object, got {type(data).__name__}")
    return data


def _read_router_tensors(files: list[Path], source: str) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError, safe_open

    tensors = {}
    for file in files:
        if not file.exists():
            raise FileNotFoundError(f"router weights {file} are missing")
        try:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():
                    if _KEY.search(key):
                        tensors[key] = _finite(handle.get_tensor(key), file, key)
        except (SafetensorError, OSError, RuntimeError) as err:  # a truncated or corrupt file, or not safetensors
            raise ValueError(f"{file} is not a readable safetensors file ({err}); it may be truncated or "
                             "corrupt") from None
    if not tensors:
        raise ValueError(f"{source} holds no router tensors (*.self_attn.mask_allocator.*)")
    return tensors


def _finite(tensor: torch.Tensor, file: Path, key: str) -> torch.Tensor:
    """``tensor``, checked to hold finite values only (a NaN router sends every head to one side)."""
    bad = ~torch.isfinite(tensor)
    if bad.any():
        index = [int(i) for i in bad.nonzero()[0]]
        raise ValueError(f"{file} holds a non-finite router weight ({tensor[tuple(index)].item()}) in {key} at "
                         f"{index}; every router weight must be a finite number")
    return tensor


def _config_from_hf(hf: dict[str, Any], tensors: dict[str, torch.Tensor], source: str) -> RouterConfig:
    shapes = {_KEY.search(k).group(2): v.shape for k, v in tensors.items()}  # the same in every layer
    if shapes.get("cls_router_head_agnostic.4.weight", (0,))[0] != 2:
        raise ValueError(f"{source}: only 2-logit (use_softmax) routers are supported; this one has 1 logit per head")
    pair = (hf.get("retrieval_mode", "full"), hf.get("toggle_type", "streaming"))
    if pair not in _HF_MODES:
        raise ValueError(f"{source}: retrieval_mode/toggle_type {pair} is not one of {sorted(_HF_MODES)}")
    heads = hf["num_attention_heads"]
    attention = ModeConfig(
        mode=_HF_MODES[pair],
        sink=hf.get("sink_size", 128),
        local=hf.get("local_window_size", 1024),
        block_size=hf.get("block_size", 128),
        xa_stride=hf.get("xattn_stride", ModeConfig.xa_stride),
        xa_threshold=hf.get("xattn_threshold", ModeConfig.xa_threshold),
    )
    return RouterConfig(
        num_layers=hf["num_hidden_layers"],
        num_kv_heads=hf.get("num_key_value_heads", heads),
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        base_model=hf.get("_name_or_path", Path(source).name),  # the folder's name: the same routers wherever they lie
        hidden_mult=shapes["cls_feat_extractor.0.weight"][0] // shapes["cls_feat_extractor.0.weight"][1],
        attention=attention,
    )
