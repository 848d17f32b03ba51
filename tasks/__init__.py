"""Benchmarks with official prompts and scoring: a registry of tasks and groups.

``tasks.get(name, data_dir=...)`` builds a task; ``tasks.expand(["ruler", "longbench_e_hotpotqa"])`` resolves groups;
``tasks.names()`` lists tasks and ``tasks.groups()`` the groups (``ruler``, ``longbench``, ``longbench_e``,
``longbench_v2``). External corpora come from a local data directory or the Hugging Face hub (see `corpora`).
Tasks of other packages (the testbed's) register through the ``elastic_bench.tasks`` entry-point group (`base`).
"""

from . import longbench, longbench_v2, ruler  # noqa: F401  (registration)
from .base import (
    GROUPS,
    REGISTRY,
    LengthTooShortError,
    Sample,
    Task,
    check_length,
    expand,
    get,
    groups,
    names,
    register,
    render,
)

__all__ = ["GROUPS", "REGISTRY", "LengthTooShortError", "Sample", "Task", "check_length", "expand", "get", "groups",
           "names", "register", "render"]
