"""What each decoder layer of a model is, read from its transformers config: the one place that answers "what kind is
layer i".

Kinds (`LayerKind.kind`):
- ``full``: softmax attention over every earlier token (Llama, Qwen3, the global layers of Gemma 3 and gpt-oss, the
  attention layers of Qwen3-Next / Qwen3.5).
- ``mla``: full softmax attention with multi-head latent attention (DeepSeek-V3: the cache holds a compressed latent,
  decompressed per head into keys wider than the values; read from ``kv_lora_rank``).
- ``sliding``: softmax attention over the last ``window`` tokens, the query's own included (Gemma 3's local layers,
  gpt-oss's banded ones; ``sliding_attention`` with the config's ``sliding_window``).
- ``linear``: a recurrent token mixer without softmax attention (Qwen3-Next's and Qwen3.5's Gated DeltaNet,
  ``linear_attention``): it never calls the attention interface.

Methods plan the ``full`` and ``mla`` layers (`LayerKind.routable`). A sliding-window layer is already sparse: the
attention glue computes its window itself and counts its skipped pairs as the model's own. The kinds come from the
config's ``layer_types`` where transformers has it; without it, every layer is ``sliding`` when the config sets a
``sliding_window`` (a Mistral-7B-v0.1-style model), else ``full``. Any other layer type is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["full", "mla", "sliding", "linear"]
LAYER_TYPES: dict[str, str] = {"full_attention": "full", "sliding_attention": "sliding",
                               "linear_attention": "linear"}
"""transformers' ``layer_types`` entries elastic-bench knows, and their kinds."""


@dataclass(frozen=True)
class LayerKind:
    """The token mixer of one decoder layer.

    Attributes:
        kind: ``full``, ``mla``, ``sliding`` or ``linear`` (module doc).
        window: the tokens a query of a ``sliding`` layer sees, its own included; None for the others.
    """

    kind: Kind
    window: int | None = None

    @property
    def routable(self) -> bool:
        """Whether methods plan this layer: full softmax attention, latent or not."""
        return self.kind in ("full", "mla")

    @property
    def softmax(self) -> bool:
        """Whether the layer calls the attention interface (every kind but ``linear``)."""
        return self.kind != "linear"


def text_config(config):
    """The decoder's config of ``config`` (itself for a text model)."""
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if get is not None else config


def layer_kinds(config) -> tuple[LayerKind, ...]:
    """The kind of every decoder layer of a model with transformers config ``config``, in layer order.

    Raises:
        ValueError: a layer type elastic-bench does not know (one line naming it), or chunked attention.
    """
    text = text_config(config)
    layers = int(text.num_hidden_layers)
    window = getattr(text, "sliding_window", None)
    types = getattr(text, "layer_types", None)
    if types is None:
        if getattr(text, "attention_chunk_size", None) is not None:
            types = ["chunked_attention"] * layers
        else:
            types = ["sliding_attention" if window is not None else "full_attention"] * layers
    unknown = sorted({t for t in types if t not in LAYER_TYPES})
    if unknown:
        raise ValueError(f"{text.model_type} has layers of type {', '.join(unknown)}; elastic-bench supports "
                         f"{', '.join(LAYER_TYPES)} layers")
    latent = getattr(text, "kv_lora_rank", None) is not None
    kinds = []
    for name in types[:layers]:
        kind = LAYER_TYPES[name]
        if kind == "sliding" and window is None:
            kind = "full"
        kinds.append(LayerKind("mla" if kind == "full" and latent else kind, window if kind == "sliding" else None))
    return tuple(kinds)


def layers_by_kind(kinds: tuple[LayerKind, ...]) -> dict[str, list[int] | int]:
    """``{kind: [layer_idx, ...]}`` for the kinds present, and ``sliding_window`` (tokens) where sliding layers are:
    what a run records as the model's ``layer_kinds``."""
    found: dict[str, list[int] | int] = {}
    for i, layer in enumerate(kinds):
        found.setdefault(layer.kind, []).append(i)
        if layer.window is not None:
            found["sliding_window"] = layer.window
    return found
