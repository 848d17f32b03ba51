"""Benchmarks with official prompts and scoring: a registry of tasks and groups.

``tasks.get(name, data_dir=...)`` builds a task; ``tasks.expand(["ruler", "longbench_e_hotpotqa"])`` resolves groups;
``tasks.names()`` lists tasks and ``tasks.GROUPS`` the groups (``ruler``, ``longbench``, ``longbench_e``,
``longbench_v2``). External corpora come from a local data directory or the Hugging Face hub (see `corpora`).
"""

from . import longbench, longbench_v2, ruler  # noqa: F401  (registration)
from .base import GROUPS, REGISTRY, Sample, Task, expand, get, names, register, render

__all__ = ["GROUPS", "REGISTRY", "Sample", "Task", "expand", "get", "names", "register", "render"]
from elastic_bench.testbed import tasks as _testbed_tasks  # noqa: E402,F401  (registration)
