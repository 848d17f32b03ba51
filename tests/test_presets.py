"""Settings presets: the code against docs/presets.md, how a run applies one (``-O`` over it, the folder and the
fingerprint naming it), ``methods --preset``, and a run with ``--preset elastic-paper`` on tiny:llama."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from elastic_bench import cli
from elastic_bench.evaluation.commands import _option_text
from elastic_bench.evaluation.presets import PRESETS, applies, describe, get_preset
from elastic_bench.evaluation.runner import RunConfig, run
from elastic_bench.foundation.options import check_value
from elastic_bench.foundation.registry import UnknownNameError
from elastic_bench.method.trainer import RouterTrainConfig
from elastic_bench.modeling.interface import get_method
from elastic_bench.results.store import Cell

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
DOC = Path(__file__).resolve().parents[1] / "docs" / "presets.md"
ROW = re.compile(r"^\| (?P<preset>[\w-]+) \| `(?P<target>[\w-]+)\.(?P<option>\w+)` \| `(?P<value>[^`]*)` \| "
                 r"(?P<source>.+) \|$")


def documented() -> set[tuple[str, str, str, str, str]]:
    """(preset, target, option, value, source) of every row of docs/presets.md's tables."""
    return {tuple(m.group("preset", "target", "option", "value", "source"))
            for m in map(ROW.match, DOC.read_text().splitlines()) if m}


def test_every_preset_value_and_source_is_the_documented_one():
    in_code = {(name, target, option, _option_text(value), source)
               for name, preset in PRESETS.items() for target, option, value, source in describe(preset)}
    table = documented()
    assert len(in_code) > 30
    assert table - in_code == set(), "documented but not in the code"
    assert in_code - table == set(), "in the code but not documented"


@pytest.mark.parametrize("name", list(PRESETS))
def test_each_preset_builds_every_method_it_names_and_train_router_takes_its_options(name):
    preset = get_preset(name)
    for method in preset.methods:
        built = get_method(method, **preset.options(method))
        assert {k: getattr(built, k) for k in preset.options(method)} == preset.options(method)
    fields = RouterTrainConfig.__dataclass_fields__
    for option, setting in preset.train_router.items():
        assert option in fields
        assert check_value(RouterTrainConfig, option, setting.value, option) == setting.value


def test_the_presets_cite_what_the_issue_names():
    paper, upstream, official = (get_preset(n) for n in ("elastic-paper", "upstream", "official-code"))
    assert paper.options("duo_attention") == {"sparsity": 0.7, "sink": 128, "local": 1024, "prefill": "one-shot"}
    assert upstream.options("duo_attention")["prefill"] == "chunked"
    assert upstream.options("duo_attention")["chunk_size"] == 32000
    assert upstream.options("prulong")["chunk_size"] == 32768
    assert official.options("elastic")["xa_threshold"] == 0.8
    assert {k: s.value for k, s in official.train_router.items() if k != "targets"} == {
        "train_pooling": "mean", "penalty": "abs", "tau_schedule": "cosine", "lambda_weight_decay": 0.1}
    assert not applies("elastic-paper", "full") and not applies(None, "duo_attention")


def test_explicit_options_override_the_preset_and_the_labels_name_it():
    config = RunConfig(model="tiny:llama", methods=["full", "duo", "xattention"], preset="elastic-paper",
                       method_options={"duo": {"sparsity": 0.5}})
    full, duo, xattention = config.build_methods()
    assert (duo.sparsity, duo.sink, duo.local) == (0.5, 128, 1024)  # -O wins, the preset's others stay
    assert [config.label(m) for m in (full, duo, xattention)] == [
        "full", "duo_attention-preset=elastic-paper-sparsity=0.5", "xattention-preset=elastic-paper"]
    upstream = RunConfig(model="tiny:llama", methods=["xattention"], preset="upstream")
    (method,) = upstream.build_methods()
    assert method.threshold == 0.8 and upstream.label(method) == "xattention-preset=upstream"


def test_a_preset_comes_from_yaml_and_an_unknown_one_names_the_closest(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("preset: upstream\nmethods: [duo_attention]\n")
    assert RunConfig.from_yaml(path)["preset"] == "upstream"
    with pytest.raises(UnknownNameError, match="did you mean elastic-paper"):
        RunConfig(methods=["full"], preset="elastic-papers")


def test_methods_preset_prints_every_option_with_its_source(capsys):
    assert cli.main(["methods", "--preset", "official-code"]) == 0
    out = capsys.readouterr().out
    assert "-O elastic.xa_threshold=0.8" in out and "train-router --penalty abs" in out
    assert "train-router --target 'Single QA=0.6," in out
    assert "official eval model hard-codes XAttention threshold 0.8" in " ".join(out.split())
    assert cli.main(["methods", "--preset", "nope"]) == 2


def test_a_run_with_the_elastic_paper_preset_records_it_per_cell(tmp_path):
    config = RunConfig(model="tiny:llama", methods=["full", "xattention", "elastic"], preset="elastic-paper",
                       method_options={"elastic": {"router": "untrained", "mode": "fa-xa"}},
                       tasks=["ruler_niah_single_1"], lengths=[640], limit=1, progress=False,
                       output=str(tmp_path / "run"))
    rows = run(config)
    assert all(r["status"] == "complete" for r in rows)
    folders = {"full": None, "xattention-preset=elastic-paper": "elastic-paper",
               "elastic-preset=elastic-paper-router=untrained-mode=fa-xa": "elastic-paper"}
    assert {r["method"] for r in rows} == set(folders)
    for folder, preset in folders.items():
        cell = Cell(config.output, "tiny-llama", folder, "ruler_niah_single_1", 640)
        recorded = json.loads((cell.dir / "config.json").read_text())
        metrics = cell.metrics()
        assert recorded["preset"] == metrics["preset"] == preset
        assert metrics["fingerprint"].get("preset") == preset
        assert metrics["method_label"] == folder
    elastic = Cell(config.output, "tiny-llama", "elastic-preset=elastic-paper-router=untrained-mode=fa-xa",
                   "ruler_niah_single_1", 640).metrics()
    assert elastic["method_options"]["xa_threshold"] == 0.9 and elastic["method_options"]["granularity"] == "block"
