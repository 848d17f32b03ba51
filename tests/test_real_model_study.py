"""The SmolLM2-135M-Instruct study shipped under docs/real-model/ (docs/real-model.md): its run folder, measured on an
H200, renders its report offline, and the report it renders is the one shipped beside it."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pytest

from elastic_bench.cli import main
from elastic_bench.foundation.files import digest

STUDY = Path(__file__).resolve().parent.parent / "docs" / "real-model"
METHODS = {"full", "streaming", "xattention", "duo_attention-pattern=gates%2Fduo-sparsity=0.7",
           "prulong-pattern=gates%2Fprulong", "elastic-router=sensitive_0.4", "elastic-router=sensitive_0.6"}
TASKS = {"ruler_niah_single_1", "ruler_niah_multikey_2", "ruler_niah_multikey_3", "ruler_vt", "ruler_cwe", "ruler_fwe"}
NUMBER = re.compile(r"[-+]?\d+\.\d+")


def _numbers(report: str) -> list[str]:
    """Every decimal figure of a report.md in order, less its generation time (which changes each rendering)."""
    return NUMBER.findall("\n".join(line for line in report.splitlines() if not line.startswith("Results: ")))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The shipped run folder, unpacked."""
    folder = tmp_path_factory.mktemp("study")
    with tarfile.open(STUDY / "run.tar.xz") as archive:
        # the "data" filter where this Python has it (3.10.12+, 3.11.4+): the archive is the repository's own
        archive.extractall(folder, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return folder / "run"


def test_the_shipped_run_holds_every_cell_of_the_study(run):
    cells = [json.loads(p.read_text()) for p in run.rglob("metrics.json")]
    assert len(cells) == len(METHODS) * len(TASKS) * 3
    assert {(c["task"], c["length"]) for c in cells} == {(t, n) for t in TASKS for n in (2048, 4096, 8192)}
    assert {p.parent.parent.parent.name for p in run.rglob("metrics.json")} == METHODS
    assert all(c["status"] == "complete" and c["num_predictions"] == 50 and c["device"] == "NVIDIA H200"
               for c in cells)
    assert len({c["source_digest"] for c in cells}) == 1  # one version of the code for the whole study


def test_the_shipped_run_renders_the_shipped_report_offline(run, tmp_path, capsys):
    assert main(["report", str(run), "--output", str(tmp_path / "report")]) == 0
    rendered = (tmp_path / "report" / "report.md").read_text()
    shipped = (STUDY / "report" / "report.md").read_text()
    assert "Pareto frontier, score vs ΩESR" in rendered and "Adaptive sparsity: ΩMSR" in rendered
    assert _numbers(rendered) == _numbers(shipped)
    pictures = sorted(p.name for p in (tmp_path / "report").glob("*.png"))
    assert pictures == sorted(p.name for p in (STUDY / "report").glob("*.png"))
    capsys.readouterr()


def test_the_shipped_learned_files_are_the_ones_the_cells_name(run):
    """The gate files digest as the DuoAttention and PruLong cells recorded them. The routers ship without their
    training folders' resume state, which the cells' digests covered then (docs/real-model.md): they are checked by
    their training configuration."""
    for method, gates in (("duo_attention-pattern=gates%2Fduo-sparsity=0.7", "duo"), ("prulong-pattern=gates%2Fprulong",
                                                                                     "prulong")):
        recorded = {json.loads(p.read_text())["fingerprint"]["artifacts"]["pattern"]
                    for p in run.glob(f"*/{method}/*/*/metrics.json")}
        assert recorded == {digest(STUDY / "gates" / gates / "full_attention_heads.tsv")}
    for name, target in (("sensitive_0.4", 0.4), ("sensitive_0.6", 0.6)):
        config = json.loads((STUDY / "routers" / name / "router_config.json").read_text())
        assert config["training"]["targets"] == {"sensitive": target, "robust": 1.0}
        assert config["training"]["steps"] == 30 and (STUDY / "routers" / name / "router.safetensors").is_file()
