"""The import contract: dependencies between elastic_bench's modules go one way, from ``LAYERS``' top to its bottom.

Run ``python -m elastic_bench.devtools.imports [--root REPO]``. It reads the source files only (``ast``; no project
code is imported) and prints the layer map, then every violating edge as ``file:line  module -> module  (rule)`` and
every import cycle. Exit status: 0 clean, 1 violations, 2 bad usage.

Rules, all checked from the tables below:

* A module imports modules of its own layer and of lower layers only. Nothing imports devtools: it is the top layer.
* In a ``separate`` layer each entry stands alone: it imports itself and lower layers, never the layer's other entries.
* ``EXTRA_RULES``: pairs that the layer order would allow but the design forbids (external packages included).
* No module imports a private name (``_x``; dunders are public) from another part: another layer, or another entry
  of a separate layer. Within a part, e.g. kernels.hybrid.flex -> kernels.hybrid.fused._x, it is allowed.
* Every module has a layer ("unassigned module") and every imported project module exists ("no such module").
* No import cycle between modules, whatever their layers (Tarjan's strongly connected components).

Imports count wherever they are, inside functions too (a lazy import is still a dependency), except under
``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT_PACKAGE = "elastic_bench"

# Lowest layer first; each entry is a folder (a package and everything below it), apart from the root package's own
# front modules. The longest entry that matches wins, and the root package ``elastic_bench`` stands for its
# ``__init__`` only, so a module added at the top of the package has no layer until it is given one.
LAYERS: list[tuple[str, bool, list[str]]] = [  # (layer, separate, entries)
    ("foundation", False, ["elastic_bench.foundation"]),
    ("results store", False, ["elastic_bench.results"]),
    ("pillars", True, ["elastic_bench.kernels", "elastic_bench.tasks", "elastic_bench.reports"]),
    ("testbed runtime", False, ["elastic_bench.testbed"]),
    ("core", True, ["elastic_bench.modeling", "elastic_bench.training"]),
    ("baselines", False, ["elastic_bench.baselines"]),
    ("method", False, ["elastic_bench.method"]),
    ("testbed tooling", False, ["elastic_bench.testbed.training"]),
    ("front", False, ["elastic_bench.cli", "elastic_bench.evaluation", "elastic_bench.bench",
                      "elastic_bench.__main__", "elastic_bench"]),
    ("devtools", False, ["elastic_bench.devtools"]),
]

# (importer, imported, reason): prefixes, each covering its submodules; the imported one may be an external package.
EXTRA_RULES: list[tuple[str, str, str]] = [
    ("elastic_bench.method", "elastic_bench.tasks", "method imports kernels and the core, not tasks"),
    ("elastic_bench.reports", "torch", "reports import no torch"),
    ("elastic_bench.results.store", "torch", "the results store imports no torch: the reports read it"),
]


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def place(module: str) -> tuple[int, str] | None:
    """``(layer index, entry)`` of ``module``, or None when no entry covers it."""
    hits = [(len(e), i, e) for i, (_, _, entries) in enumerate(LAYERS) for e in entries
            if (module == e if e == ROOT_PACKAGE else within(module, e))]
    return max(hits)[1:] if hits else None


def part(where: tuple[int, str]) -> tuple[int, str]:
    """What a private name may not leave: the layer, or the entry in a separate layer."""
    return (where[0], where[1] if LAYERS[where[0]][1] else "")


def find_modules(root: Path) -> tuple[dict[str, Path], set[str]]:
    """Every module of ``root/elastic_bench`` -> its file, and the package folders (namespace ones included)."""
    base = (root / ROOT_PACKAGE).resolve()
    modules: dict[str, Path] = {}
    folders: set[str] = set()
    for file in sorted(base.rglob("*.py")):
        rel = file.relative_to(base).parts
        if "__pycache__" in rel:
            continue
        parts = [ROOT_PACKAGE, *rel[:-1]] + ([] if file.name == "__init__.py" else [file.stem])
        modules[".".join(parts)] = file
        folders.update(".".join([ROOT_PACKAGE, *rel[:i]]) for i in range(len(rel)))
    return modules, folders


def imports_of(module: str, file: Path, known: set[str]):
    """Yield ``(line, imported module, imported name or None)`` for each import in ``file``."""
    is_package = file.name == "__init__.py"
    stack = list(ast.parse(file.read_text(encoding="utf-8"), str(file)).body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: climb from the importing module's package
                package = module.split(".")[: len(module.split(".")) - (not is_package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                yield (node.lineno, sub, None) if sub in known else (node.lineno, base, alias.name)
        stack.extend(ast.iter_child_nodes(node))


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def check(root: Path) -> tuple[dict[str, Path], list[str], list[list[str]]]:
    """The modules, the violation lines and the cycles (each a sorted list of modules) of the tree at ``root``."""
    modules, folders = find_modules(root)
    known = set(modules) | folders
    graph: dict[str, set[str]] = {m: set() for m in modules}
    problems: list[str] = []
    for src, file in sorted(modules.items()):
        rel, here = file.relative_to(root.resolve()), place(src)
        if here is None:
            problems.append(f"{rel}:1  {src}  (unassigned module: give it a layer)")
        try:
            found = sorted(imports_of(src, file, known), key=lambda t: t[0])
        except SyntaxError as err:
            problems.append(f"{rel}:{err.lineno}  {src}  (cannot parse: {err.msg})")
            continue
        for line, dst, name in found:
            rules = [why for a, b, why in EXTRA_RULES if within(src, a) and within(dst, b)]
            if within(dst, ROOT_PACKAGE) and dst != src:
                there = place(dst)
                if dst not in known:
                    rules.append("no such module")
                elif here and there:
                    if there[0] > here[0]:
                        rules.append(f"reverse edge: {LAYERS[here[0]][0]} may not import {LAYERS[there[0]][0]}")
                    elif there[0] == here[0] and LAYERS[here[0]][1] and there[1] != here[1]:
                        rules.append(f"{LAYERS[here[0]][0]} entries are separate: {here[1]} may not import {there[1]}")
                    private = [p for p in [*dst.split("."), name or ""] if is_private(p)]
                    if private and part(here) != part(there):
                        rules.append(f"private name {private[-1]} imported from another part")
                if dst in graph:
                    graph[src].add(dst)
            problems.extend(f"{rel}:{line}  {src} -> {dst}  ({why})" for why in rules)
    return modules, list(dict.fromkeys(problems)), cycles(graph)  # `from a import x, y`: one line per rule


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m elastic_bench.devtools.imports", description=__doc__.split(".")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2], help="repository root")
    root = parser.parse_args(argv).root
    if not (root / "pyproject.toml").is_file():
        print(f"error: no pyproject.toml in {root}", file=sys.stderr)
        return 2
    modules, problems, loops = check(root)
    print("layers (lowest first; a module imports its own layer and lower ones):")
    for i, (layer, separate, entries) in enumerate(LAYERS):
        count = sum(1 for m in modules if (place(m) or (-1,))[0] == i)
        note = "  (entries separate)" if separate else ""
        print(f"  {i + 1}. {layer:<16}{count:>3} modules  {', '.join(entries)}{note}")
    if not problems and not loops:
        print("no reverse edge, no cycle")
        return 0
    print(f"{len(problems)} violation(s), {len(loops)} cycle(s):")
    for problem in problems:
        print(f"  {problem}")
    for loop in loops:
        print(f"  cycle: {' <-> '.join(loop)}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
