"""Reports: run folders → tables, plots and pages a reader of the field looks for (no torch).

Reads run folders through the results store (`elastic_bench.results.store`) only. Public API:

- `load_cells(run_dir, run="")`: the cells of a run folder (`CellResult`, their samples `SampleResult` read on use);
- `summarize(cells, protocol)`: one `Comparison` per model, its method configurations (`Config`) on the cells all
  completed, with their Pareto `Frontier`s, averaged under a benchmark protocol (`elastic_bench.results.protocols`,
  ``official`` by default); `compare(cells, protocol)`: one `Comparison` of the configurations of several runs;
- `run_names(paths)`: short distinct names of run folders, for `load_cells(..., run=name)`;
- `write_report(comparisons, output, source)`: ``report.md`` with PNG plots beside it, and a self-contained
  ``report.html``;
- `pareto_front(points)`, `paired_difference(a, b, cells, clusters)` (paired bootstrap by item, stratified by cell,
  `Difference`): the two statistics the report rests on.
"""

from .bootstrap import Difference, paired_difference
from .collect import CellResult, SampleResult, load_cells
from .labels import run_names
from .render import write_report
from .summary import Comparison, Config, Frontier, compare, pareto_front, summarize

__all__ = [
    "CellResult",
    "Comparison",
    "Config",
    "Difference",
    "Frontier",
    "SampleResult",
    "compare",
    "load_cells",
    "paired_difference",
    "run_names",
    "pareto_front",
    "summarize",
    "write_report",
]
