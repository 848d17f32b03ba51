"""Benchmarks with official prompts and scoring: a registry of tasks and groups.

``tasks.get(name)`` builds a task; ``tasks.expand(["ruler", "longbench_e_hotpotqa"])`` resolves groups;
``tasks.names()`` lists tasks and ``tasks.GROUPS`` the groups.
"""

from . import ruler  # noqa: F401  (registration)
from .base import GROUPS, REGISTRY, Sample, Task, expand, get, names, register, render

__all__ = ["GROUPS", "REGISTRY", "Sample", "Task", "expand", "get", "names", "register", "render"]
