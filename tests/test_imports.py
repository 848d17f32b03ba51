"""The import contract (elastic_bench/devtools/imports.py): the real tree passes, and each rule catches its breach."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from elastic_bench.devtools import imports

REPO = Path(__file__).resolve().parents[1]

PYPROJECT = """\
[project]
name = "toy"

[tool.ruff]
line-length = 120
"""

# A clean miniature of the real layout; each test adds or replaces a file to break one rule.
CLEAN = {
    "elastic_bench/__init__.py": "",
    "elastic_bench/foundation/registry.py": "import json\n",
    # dunders are public
    "elastic_bench/modeling/interface.py": "from elastic_bench.kernels import HeadPlan, __version__\n",
    "elastic_bench/modeling/attention.py": "from elastic_bench.modeling.interface import Method\n",
    "elastic_bench/evaluation/runner.py": "from elastic_bench import tasks\nfrom elastic_bench.kernels import plan\n",
    "elastic_bench/cli.py": "def main():\n    from elastic_bench.evaluation.runner import run\n",
    "elastic_bench/testbed/__init__.py": "from elastic_bench.tasks.base import Task\n",
    "elastic_bench/testbed/training/train.py": "from elastic_bench.method import router\n",  # a namespace package
    "elastic_bench/kernels/__init__.py": "from .plan import HeadPlan\n",
    "elastic_bench/kernels/plan.py": textwrap.dedent("""\
        from typing import TYPE_CHECKING

        from elastic_bench.foundation.registry import Registry

        if TYPE_CHECKING:
            from elastic_bench.evaluation.runner import RunConfig
        """),
    "elastic_bench/kernels/hybrid/__init__.py": "",
    "elastic_bench/kernels/hybrid/fused.py": "from ..plan import HeadPlan\n_x = 1\n",
    # private, but the same pillar
    "elastic_bench/kernels/hybrid/flex.py": "from elastic_bench.kernels.hybrid.fused import _x\n",
    "elastic_bench/tasks/__init__.py": "",
    "elastic_bench/tasks/base.py": "from elastic_bench.foundation.registry import Registry\n",
    "elastic_bench/reports/__init__.py": "import json\n",
    "elastic_bench/method/__init__.py": "",
    "elastic_bench/method/router.py": ("import torch\nfrom elastic_bench.kernels import plan\n"
                         "from elastic_bench.modeling.interface import M\n"),
    "tests/test_toy.py": "import elastic_bench.devtools\n",  # tests/ is no package: not checked
}


def run_tree(tmp_path: Path, capsys, changes: dict[str, str] | None = None) -> tuple[int, str]:
    """Write CLEAN, with ``changes`` (path -> source) on top, into ``tmp_path``; run the checker: exit code, output."""
    files = {**CLEAN, **(changes or {})}
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    code = imports.main(["--root", str(tmp_path)])
    return code, capsys.readouterr().out


def check(tmp_path: Path, capsys, changes: dict[str, str]) -> tuple[int, list[str]]:
    """Exit code and the violation/cycle lines of CLEAN plus ``changes``."""
    code, out = run_tree(tmp_path, capsys, changes)
    lines = out.splitlines()
    heads = [i for i, line in enumerate(lines) if "violation(s)" in line]
    return code, [line.strip() for line in lines[heads[0] + 1 :]] if heads else []


def test_real_tree_passes(capsys):
    code = imports.main(["--root", str(REPO)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "no reverse edge, no cycle" in out


def test_clean_toy_tree_passes(tmp_path, capsys):
    code, out = run_tree(tmp_path, capsys)
    assert code == 0, out
    assert out.splitlines()[0].startswith("layers")
    assert "  3. pillars           8 modules" in out  # kernels 5, tasks 2, reports 1
    assert out.splitlines()[-1] == "no reverse edge, no cycle"


def test_reverse_edge(tmp_path, capsys):
    code, found = check(tmp_path, capsys,
                        {"elastic_bench/kernels/bad.py": "import os\nimport elastic_bench.evaluation.runner\n"})
    assert code == 1
    assert found == ["elastic_bench/kernels/bad.py:2  elastic_bench.kernels.bad -> elastic_bench.evaluation.runner  "
                     "(reverse edge: pillars may not import front)"]


def test_nothing_imports_devtools(tmp_path, capsys):
    code, found = check(tmp_path, capsys, {"elastic_bench/devtools/__init__.py": "",
                                           "elastic_bench/cli.py": "from elastic_bench.devtools import imports\n"})
    assert code == 1
    assert found == ["elastic_bench/cli.py:1  elastic_bench.cli -> elastic_bench.devtools  "
                     "(reverse edge: front may not import devtools)"]


def test_type_checking_import_is_ignored_but_the_same_import_unguarded_is_not(tmp_path, capsys):
    unguarded = "from elastic_bench.evaluation.runner import RunConfig\n"
    code, found = check(tmp_path, capsys, {"elastic_bench/kernels/plan.py": unguarded})
    assert code == 1
    assert found == ["elastic_bench/kernels/plan.py:1  elastic_bench.kernels.plan -> elastic_bench.evaluation.runner  "
                     "(reverse edge: pillars may not import front)",
                     # runner imports kernels.plan
                     "cycle: elastic_bench.evaluation.runner <-> elastic_bench.kernels.plan"]


def test_cycle(tmp_path, capsys):
    lazy = "def f():\n    from . import attention\n"
    code, found = check(tmp_path, capsys, {"elastic_bench/modeling/interface.py": lazy})
    assert code == 1
    assert found == ["cycle: elastic_bench.modeling.attention <-> elastic_bench.modeling.interface"]


def test_three_module_cycle_through_a_package_init(tmp_path, capsys):
    code, found = check(tmp_path, capsys, {
        "elastic_bench/tasks/__init__.py": "from .base import Task\n",
        "elastic_bench/tasks/base.py": "from .ruler import Ruler\n",
        "elastic_bench/tasks/ruler.py": "import elastic_bench.tasks\n",
    })
    assert code == 1
    assert found == ["cycle: elastic_bench.tasks <-> elastic_bench.tasks.base <-> elastic_bench.tasks.ruler"]


def test_reports_import_no_torch(tmp_path, capsys):
    code, found = check(tmp_path, capsys, {"elastic_bench/reports/render.py": "import json\nimport torch.nn as nn\n"})
    assert code == 1
    assert found == ["elastic_bench/reports/render.py:2  elastic_bench.reports.render -> torch.nn  "
                     "(reports import no torch)"]


def test_results_store_imports_no_torch(tmp_path, capsys):
    code, found = check(tmp_path, capsys, {"elastic_bench/results/store.py": "import torch\n"})
    assert code == 1
    assert found == ["elastic_bench/results/store.py:1  elastic_bench.results.store -> torch  "
                     "(the results store imports no torch: the reports read it)"]


def test_model_side_and_training_side_are_separate(tmp_path, capsys):
    code, found = check(tmp_path, capsys, {"elastic_bench/training/engine.py": "from elastic_bench.modeling import x\n",
                                           "elastic_bench/modeling/x.py": ""})
    assert code == 1
    assert found == ["elastic_bench/training/engine.py:1  elastic_bench.training.engine -> elastic_bench.modeling.x  "
                     "(core entries are separate: elastic_bench.training may not import elastic_bench.modeling)"]


def test_lazy_import_inside_a_function_counts(tmp_path, capsys):
    lazy = "class A:\n    def f(self):\n        if True:\n            from elastic_bench.tasks import base\n"
    code, found = check(tmp_path, capsys, {"elastic_bench/kernels/lazy.py": lazy})
    assert code == 1
    assert found == ["elastic_bench/kernels/lazy.py:4  elastic_bench.kernels.lazy -> elastic_bench.tasks.base  "
                     "(pillars entries are separate: elastic_bench.kernels may not import elastic_bench.tasks)"]


def test_relative_import_is_resolved(tmp_path, capsys):
    code, found = check(tmp_path, capsys, {"elastic_bench/kernels/hybrid/naive.py": "from ..plan import HeadPlan\n"
                                                                      "from ...evaluation import runner\n"})
    assert code == 1
    assert found == ["elastic_bench/kernels/hybrid/naive.py:2  elastic_bench.kernels.hybrid.naive -> "
                     "elastic_bench.evaluation.runner  (reverse edge: pillars may not import front)"]


def test_method_does_not_import_tasks(tmp_path, capsys):
    code, found = check(tmp_path, capsys,
                        {"elastic_bench/method/data.py": "def f():\n    from elastic_bench.tasks.base import x\n"})
    assert code == 1
    assert found == ["elastic_bench/method/data.py:2  elastic_bench.method.data -> elastic_bench.tasks.base  "
                     "(method imports kernels and the core, not tasks)"]


def test_private_name_across_pillars(tmp_path, capsys):
    code, found = check(tmp_path, capsys,
                        {"elastic_bench/reports/collect.py": "from elastic_bench.tasks.base import _score\n"})
    assert code == 1
    assert "elastic_bench/reports/collect.py:1  elastic_bench.reports.collect -> elastic_bench.tasks.base  " \
           "(private name _score imported from another part)" in found


def test_private_name_across_layers_even_where_the_edge_is_allowed(tmp_path, capsys):
    code, found = check(tmp_path, capsys, {
        "elastic_bench/method/router.py": "from elastic_bench.kernels.plan import Plan, _tile\n",
        "elastic_bench/evaluation/runner.py": "from elastic_bench.kernels import _impl\n",
    })
    assert code == 1
    assert found == [  # sorted by importing module
        "elastic_bench/evaluation/runner.py:1  elastic_bench.evaluation.runner -> elastic_bench.kernels  "
        "(private name _impl imported from another part)",
        "elastic_bench/method/router.py:1  elastic_bench.method.router -> elastic_bench.kernels.plan  "
        "(private name _tile imported from another part)",
    ]


def test_unassigned_module(tmp_path, capsys):
    code, found = check(tmp_path, capsys, {"elastic_bench/sparsity.py": "import math\n"})
    assert code == 1
    assert found == ["elastic_bench/sparsity.py:1  elastic_bench.sparsity  (unassigned module: give it a layer)"]


def test_import_of_a_missing_module(tmp_path, capsys):
    code, found = check(tmp_path, capsys, {"elastic_bench/cli.py": "import elastic_bench.methods.base\n"})
    assert code == 1
    assert found == ["elastic_bench/cli.py:1  elastic_bench.cli -> elastic_bench.methods.base  (no such module)"]


def test_from_import_counts_a_submodule_else_the_package(tmp_path):
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    for rel in ("elastic_bench/kernels/__init__.py", "elastic_bench/kernels/plan.py",
                "elastic_bench/kernels/hybrid/__init__.py", "elastic_bench/kernels/hybrid/fused.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    source = (
        "from elastic_bench.kernels import plan, HeadPlan\nfrom . import fused\n"
        "import elastic_bench.kernels.hybrid\n"
    )
    (tmp_path / "elastic_bench/kernels/hybrid/flex.py").write_text(source)
    modules, folders = imports.find_modules(tmp_path)
    assert sorted(modules) == ["elastic_bench.kernels", "elastic_bench.kernels.hybrid",
                               "elastic_bench.kernels.hybrid.flex", "elastic_bench.kernels.hybrid.fused",
                               "elastic_bench.kernels.plan"]
    found = sorted(imports.imports_of("elastic_bench.kernels.hybrid.flex",
                                      tmp_path / "elastic_bench/kernels/hybrid/flex.py", set(modules) | folders))
    assert found == [(1, "elastic_bench.kernels", "HeadPlan"), (1, "elastic_bench.kernels.plan", None),
                     (2, "elastic_bench.kernels.hybrid.fused", None), (3, "elastic_bench.kernels.hybrid", None)]


def test_bad_usage_exits_2(tmp_path, capsys):
    assert imports.main(["--root", str(tmp_path / "nowhere")]) == 2
    with pytest.raises(SystemExit) as exit_:
        imports.main(["--no-such-flag"])
    assert exit_.value.code == 2


def test_the_repository_root_holds_no_package_but_elastic_bench():
    """``python -m`` (pytest, ``python -m elastic_bench``) puts the working directory first on ``sys.path``: a folder
    there named like an installed package would shadow it (a ``kernels/`` folder hides the ``kernels`` package that
    transformers imports since 5.25)."""
    packages = sorted(p.name for p in REPO.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    modules = sorted(p.name for p in REPO.glob("*.py") if p.name != "setup.py")
    assert (packages, modules) == (["elastic_bench"], [])
