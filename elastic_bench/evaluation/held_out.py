"""The held-out rule: a router or gate file is not scored on a task whose generator or dataset its training data
holds, unless the run says so (``--allow-in-distribution``), and then every such cell says so.

A learned file's provenance (`elastic_bench.training.provenance`, read by its method: `Method.provenance`) names the
identities of its data; a task declares its own (`elastic_bench.tasks.Task.identities`). They meet: the task is
in-distribution for the file. A file of unknown provenance (None: an older file, a released checkpoint) is never
refused; the reports mark it "provenance unknown".
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastic_bench.training.provenance import shared

if TYPE_CHECKING:
    from elastic_bench.modeling.interface import Method


def artifact_provenance(method: Method, model_dir: str) -> dict[str, tuple[Path, dict[str, Any] | None]]:
    """Each learned file ``method`` loads for the model at ``model_dir`` (`Method.artifacts`), by option name: its
    path and its provenance (None: unknown)."""
    return {name: (Path(path), method.provenance(name, Path(path)))
            for name, path in method.artifacts(model_dir).items()}


def in_distribution(provenances: dict[str, dict[str, Any] | None], identities: frozenset[str]
                    ) -> list[dict[str, Any]]:
    """A cell's ``in_distribution`` field: ``[{"artifact": option name, "shared": [identity, ...]}]`` for each
    learned file of ``provenances`` (option name → provenance) whose data shares an identity with a task of
    ``identities``; empty for a held-out cell."""
    found = ((name, shared(provenance, identities)) for name, provenance in provenances.items())
    return [{"artifact": name, "shared": common} for name, common in found if common]


def refuse_in_distribution(method: Method, artifacts: dict[str, tuple[Path, dict[str, Any] | None]],
                           tasks: dict[str, frozenset[str]]) -> None:
    """Refuse to score a task of ``tasks`` (name → identities) with a learned file of ``method`` (``artifacts``, as
    `artifact_provenance` gives them) whose data shares an identity with it.

    Raises:
        ValueError: one line naming the file, the task and what they share.
    """
    for name, (path, provenance) in artifacts.items():
        for task, identities in tasks.items():
            common = shared(provenance, identities)
            if common:
                raise ValueError(f"{path} ({method.name}.{name}) was trained on data that shares {', '.join(common)} "
                                 f"with the task {task}: a learned file is not scored on what it was trained on; pass "
                                 "--allow-in-distribution to score it anyway (its cells are marked in-distribution)")
