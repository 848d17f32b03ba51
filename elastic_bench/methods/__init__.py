"""Registered sparse-attention methods: ``methods.get(name, **knobs)``, ``methods.names()``.

Adding a method: a dataclass subclassing `Method` in its own module here, decorated with ``@register("name")``,
imported below, with tests under ``tests/`` and a line in the README's method table.
"""

from . import duo_attention, elastic, full, streaming, xattention  # noqa: F401  (registration)
from .base import REGISTRY, AttentionCall, Method, Phase, get, names, register

__all__ = ["REGISTRY", "AttentionCall", "Method", "Phase", "get", "names", "register"]
