"""End-to-end benchmarks of models under methods (``elastic-bench bench prefill``, ``bench decode``)."""

from __future__ import annotations

from typing import Any


def provenance_line(report: dict[str, Any]) -> str | None:
    """The last line of a benchmark table: date, device, model, versions and code of a report with ``provenance``
    (None without one)."""
    prov = report.get("provenance")
    if not prov:
        return None
    versions = ", ".join(f"{k} {v}" for k, v in prov["versions"].items() if v)
    code = f"code {prov.get('git_hash') or 'outside git'}, source digest {prov.get('source_digest')}"
    return f"{prov['date']} · {prov['device']} · {report['config']['model']} · {versions} · {code}"
