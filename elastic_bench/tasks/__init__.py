"""Benchmarks with official prompts and scoring: a registry of tasks and groups.

``tasks.get(name, data_dir=...)`` builds a task; ``tasks.expand(["ruler", "longbench_e_hotpotqa"])`` resolves groups;
``tasks.names()`` lists tasks and ``tasks.groups()`` the groups (``ruler``, ``ruler2``, ``longbench``, ``longbench_e``,
``longbench_v2``, ``nolima``, ``babilong``, ``mrcr``, ``graphwalks``, ``helmet`` and its categories,
``longbench_pro``, ``mixed_suite``); `catalog` lists every benchmark with its data source and licence. External
corpora come from a local data directory or the Hugging Face hub (see `corpora`).
Tasks of other packages (the testbed's) register through the ``elastic_bench.tasks`` entry-point group (`base`).
"""

from . import (  # noqa: F401  (the benchmark modules register their tasks on import)
    babilong,
    code_completion,
    graphwalks,
    helmet,
    longbench,
    longbench_pro,
    longbench_v2,
    mrcr,
    nolima,
    ruler,
    ruler2,
)
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
