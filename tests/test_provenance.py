"""What learned files were trained on, and the held-out rule (issue 47): the identities tasks and records declare, the
provenance train-router records (its records, the official mixture by name), and `run` refusing a router trained on
the generator of the task it would score, unless told (then every cell says so)."""

from __future__ import annotations

import json

import pytest

from elastic_bench import tasks
from elastic_bench.cli import main
from elastic_bench.method.checkpoint import read_provenance
from elastic_bench.training.make_records import DEFAULT_TASKS, make_task
from elastic_bench.training.provenance import learned_provenance, shared
from elastic_bench.training.record_text import GeneratedText
from elastic_bench.training.records import OFFICIAL_IDENTITIES, PAPER_LABELS

TINY_TRAINING = ["--model", "tiny:llama", "--steps", "2", "--rows-per-step", "1", "--pack-tokens", "1024",
                 "--eval-samples", "1", "--device", "cpu", "--no-progress"]


def _identities(name: str) -> frozenset[str]:
    return tasks.REGISTRY.get(name).identities


def test_every_registered_task_declares_what_it_draws_on_and_shared_sources_meet():
    assert all(_identities(name) for name in tasks.names())
    assert _identities("ruler_qa_2") & _identities("longbench_hotpotqa") == {"dataset:hotpotqa"}
    assert _identities("longbench_e_hotpotqa") == _identities("longbench_hotpotqa")
    assert _identities("ruler_niah_single_1") == _identities("ruler_niah_multikey_3") == {"generator:ruler.niah"}
    assert _identities("ruler_qa_1") == {"generator:ruler.qa", "dataset:squad"}
    assert _identities("testbed_niah_single") == {"generator:testbed.niah_single"}
    assert _identities("longbench_musique") & OFFICIAL_IDENTITIES == {"dataset:musique"}


def test_the_default_records_carry_the_five_labels_and_share_nothing_with_a_benchmark():
    benchmarks = set().union(*(_identities(name) for name in tasks.names()))
    text = GeneratedText()
    default = [make_task(name, text) for name in DEFAULT_TASKS]
    assert {task.label: task.category for task in default} == PAPER_LABELS
    assert not set().union(*(task.identities for task in default)) & benchmarks
    # the tasks kept for --tasks that share a benchmark's generator say so
    assert make_task("ruler_niah_single_1", text).identities == _identities("ruler_niah_single_1")
    assert make_task("recent_needle", text).identities == _identities("testbed_niah_recent")


def test_a_router_trained_on_ruler_records_is_refused_on_ruler_unless_allowed(tmp_path, capsys, monkeypatch):
    records, router, output = tmp_path / "records.jsonl", tmp_path / "router", tmp_path / "run"
    assert main(["records", "--model", "tiny:llama", "--tasks", "ruler_niah_single_1,repeat", "--lengths", "1K",
                 "--samples", "1", "--output", str(records), "--no-progress"]) == 0
    assert main(["train-router", *TINY_TRAINING, "--data", str(records), "--output", str(router)]) == 0
    provenance = read_provenance(router)
    assert provenance["data"]["identities"] == ["generator:records.repeat", "generator:records.reports",
                                                "generator:ruler.niah"]
    run = ["run", "--model", "tiny:llama", "--methods", "elastic", "-O", f"elastic.router={router}", "--tasks",
           "ruler_niah_single_1", "--lengths", "1K", "--limit", "1", "--device", "cpu", "--no-progress", "--output",
           str(output)]
    capsys.readouterr()

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    with monkeypatch.context() as patched:
        patched.setattr("elastic_bench.modeling.loading.load_model", refuse)
        assert main(run) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and not output.exists()
    assert f"{router} (elastic.router)" in error[0] and "generator:ruler.niah with the task ruler_niah_single_1" in \
        error[0] and "--allow-in-distribution" in error[0]

    assert main([*run, "--allow-in-distribution"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("tiny-llama"))
    assert row.split()[-1] == "‡"  # the in-dist column: in-distribution, scored under --allow-in-distribution
    cell = next(output.glob("*/*/ruler_niah_single_1/1024"))
    for recorded in (json.loads((cell / "config.json").read_text()), json.loads((cell / "metrics.json").read_text())):
        assert recorded["in_distribution"] == [{"artifact": "router", "shared": ["generator:ruler.niah"]}]
        assert recorded["allow_in_distribution"] is True
        assert recorded["artifact_provenance"] == {"router": provenance}
    assert "allow_in_distribution" not in recorded["fingerprint"]  # it changes no prediction


def test_train_router_reads_the_official_mixture_by_name_and_says_what_it_read(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    name = "LCM_group/qwen_mix_sft_64K6"
    folder = tmp_path / "data" / name / "data"
    folder.mkdir(parents=True)
    rows = [{"context": f"Passage {i} about {label}. " * 8, "question": f"What is passage {i} about?",
             "answer": label, "metadata": {"task": label, "is_prefix": i % 2 == 0}}
            for label in PAPER_LABELS for i in range(2)]
    pq.write_table(pa.Table.from_pylist(rows), folder / "train-00000.parquet")
    router = tmp_path / "router"
    assert main(["train-router", *TINY_TRAINING, "--data", name, "--data-dir", str(tmp_path / "data"), "--output",
                 str(router)]) == 0
    read = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("train-router data:"))
    assert f"official:{name} ({tmp_path / 'data' / name})" in read and "10 records read, 10 kept" in read
    assert all(f"{label} 2" in read for label in PAPER_LABELS)
    provenance = read_provenance(router)
    data = provenance["data"]
    assert data["source"] == f"official:{name}" and data["tasks"] == PAPER_LABELS and data["records"] == 10
    assert set(data["identities"]) == OFFICIAL_IDENTITIES and provenance["steps"] == 2
    assert provenance["recipe"] == "custom"  # 2 steps: not the paper's recipe
    assert learned_provenance(data, 300, 1)["recipe"] == "paper"
    assert learned_provenance({**data, "source": "file"}, 300, 1)["recipe"] == "custom"
    assert shared(provenance, _identities("longbench_gov_report")) == ["dataset:gov_report"]


def test_an_official_mixture_that_is_nowhere_is_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch,
                                                                                no_model):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["train-router", *TINY_TRAINING, "--data", "LCM_group/llama_mix_sft_64K6", "--data-dir",
                 str(tmp_path), "--output", str(tmp_path / "router")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "https://modelscope.cn/datasets/LCM_group/llama_mix_sft_64K6" in error[0]
    assert f"into {tmp_path / 'LCM_group' / 'llama_mix_sft_64K6'}/" in error[0] and "HF_HUB_OFFLINE" in error[0]


def test_learned_files_without_provenance_read_as_unknown_and_a_malformed_one_is_one_error(tmp_path):
    from elastic_bench.baselines.gates import gate_provenance
    from elastic_bench.evaluation.held_out import in_distribution
    from elastic_bench.modeling.loading import TESTBED_DIR

    shipped = read_provenance(TESTBED_DIR / "elastic_router")  # written from its recorded training block
    assert shipped["data"]["records"] == 768 and shipped["steps"] == 300 and shipped["recipe"] == "custom"
    assert in_distribution({"router": shipped}, _identities("testbed_repeat")) == [
        {"artifact": "router", "shared": ["generator:testbed.repeat"]}]
    assert gate_provenance(TESTBED_DIR / "head_gates.tsv") is None  # the ablation file: no trainer's record
    assert read_provenance(tmp_path) is None  # a released model's folder holds no router_config.json
    router = tmp_path / "router"
    router.mkdir()
    (router / "router_config.json").write_text(json.dumps({"training": {"steps": 3}}))  # an older file
    assert read_provenance(router) is None and in_distribution({"router": None}, {"generator:ruler.niah"}) == []
    (router / "router_config.json").write_text(json.dumps({"training": {"provenance": {"data": {"identities": 1}}}}))
    with pytest.raises(ValueError, match=r"router_config.json: provenance.data.identities must be a list of strings"):
        read_provenance(router)
    gates = tmp_path / "gates"
    gates.mkdir()
    (gates / "full_attention_heads.tsv").write_text("1\t0\n")
    (gates / "config.json").write_text(json.dumps({"trainer": "train-duo"}))
    assert gate_provenance(gates) is None


def test_a_router_trained_on_the_default_records_is_held_out_for_the_mixed_suite():
    """The default records share no identity with code_completion, and the held-out check `run` makes lets a router
    trained on them be scored on every task of the mixed suite (and refuses one trained on torch's source)."""
    from pathlib import Path

    from elastic_bench import get_method
    from elastic_bench.evaluation.held_out import in_distribution, refuse_in_distribution
    from elastic_bench.method.data import data_provenance_of
    from elastic_bench.modeling.loading import byte_tokenizer
    from elastic_bench.training.make_records import router_records

    default = [make_task(name, GeneratedText()) for name in DEFAULT_TASKS]
    assert not set().union(*(task.identities for task in default)) & _identities("code_completion")
    records = list(router_records(byte_tokenizer(), [1024], 3, default))  # 3 per category: every task
    assert {r["task"] for r in records} == set(DEFAULT_TASKS)
    router = learned_provenance(data_provenance_of("records", None, records, [1024]), 2, 2048)
    suite = {name: _identities(name) for name in tasks.expand(["mixed_suite"])}
    assert list(suite) == ["ruler_niah_single_1", "ruler_vt", "code_completion"]
    method = get_method("elastic")
    refuse_in_distribution(method, {"router": (Path("router"), router)}, suite)  # raises nothing: held out
    assert all(in_distribution({"router": router}, identities) == [] for identities in suite.values())
    router["data"]["identities"].append("dataset:python_source.torch")
    with pytest.raises(ValueError, match="shares dataset:python_source.torch with the task code_completion"):
        refuse_in_distribution(method, {"router": (Path("router"), router)}, suite)
