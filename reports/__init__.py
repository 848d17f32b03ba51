"""Reports: results folders → per-model tables, Pareto frontiers and plots, rendered as Markdown and HTML.

Reads the result files of `elastic_bench.results` only; imports no torch. Public API: `load_cells` (the cells of a run
folder), `summarize` (per-model method summaries and frontiers), `write_report` (``report.md``, ``report.html``).
"""

from .collect import CellResult, load_cells
from .render import write_report
from .summary import Frontier, MethodSummary, ModelReport, pareto_front, summarize

__all__ = [
    "CellResult",
    "Frontier",
    "MethodSummary",
    "ModelReport",
    "load_cells",
    "pareto_front",
    "summarize",
    "write_report",
]
