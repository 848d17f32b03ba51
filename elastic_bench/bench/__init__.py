"""End-to-end benchmarks of models under methods (``elastic-bench bench prefill``, ``bench decode``): what their
configs check alike, and their tables' cells."""

from __future__ import annotations

from typing import Any


def with_router(methods: list[str], router: str | None) -> list[str]:
    """``methods`` with ``elastic`` added when a ``router`` (``--router``: a checkpoint folder, or ``untrained``) is
    given. Refuses ``elastic`` without a router, and a router that is not a checkpoint folder (checked without
    reading its weights)."""
    if router is None:
        if "elastic" in methods:
            raise ValueError("method elastic needs --router DIR (a router checkpoint, or untrained)")
        return methods
    from elastic_bench.modeling.interface import get_method

    get_method("elastic", router=router)
    return methods if "elastic" in methods else [*methods, "elastic"]


def formatted(record: dict[str, Any], key: str, spec: str, scale: float = 1.0) -> str:
    """A table cell: ``record[key] · scale`` in the format ``spec``; empty where the record has no value."""
    value = record.get(key)
    return "" if value is None else format(value * scale, spec)


def with_provenance(lines: list[str], report: dict[str, Any]) -> str:
    """A benchmark table: its ``lines`` and, for a report with ``provenance``, a last line with the date, device,
    model, versions and code."""
    prov = report.get("provenance")
    if prov:
        versions = ", ".join(f"{k} {v}" for k, v in prov["versions"].items() if v)
        code = f"code {prov.get('git_hash') or 'outside git'}, source digest {prov.get('source_digest')}"
        lines = [*lines, f"{prov['date']} · {prov['device']} · {report['config']['model']} · {versions} · {code}"]
    return "\n".join(lines)
