"""A cell is known by everything that made it (issue 39): the task, what its corpus files hold, what the model's files
hold, the KV cache, and the learned files read once; a cell of another fingerprint is refused, never mixed, and its
files are left as they were."""

from __future__ import annotations

import filecmp
import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from fixtures.cli import main, one_line, tiny_run
from fixtures.tasks_data import write_ruler

from elastic_bench.foundation.files import digest
from elastic_bench.results import digests
from elastic_bench.results.store import Cell

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TESTBED = Path(__file__).resolve().parents[1] / "elastic_bench" / "data" / "testbed"


@pytest.fixture(autouse=True)
def digest_cache(tmp_path, monkeypatch):
    """A digest cache of the test's own."""
    monkeypatch.setenv(digests.CACHE_VAR, str(tmp_path / "cache"))


def files(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with the SHA-256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def unfinish(out: Path) -> None:
    """Make every cell of ``out`` an interrupted one: its config.json and predictions, no metrics.json."""
    for metrics in out.glob("*/*/*/*/metrics.json"):
        metrics.unlink()


def refused(argv, capsys, out: Path, fields: str) -> None:
    """``argv`` stops in one line naming the differing fingerprint ``fields``, and leaves ``out`` as it was."""
    before = files(out)
    code, err = main(argv, capsys)
    assert code == 2 and f"holds results of another configuration ({fields} differ)" in one_line(err)
    assert files(out) == before


def corpora(folder: Path, seed: int) -> Path:
    """A data folder of RULER's corpora, their text drawn with ``seed``."""
    write_ruler(folder, random.Random(seed))
    return folder


# ---- the data a task read --------------------------------------------------------------------------------------------


def test_a_cell_resumed_or_reused_under_another_corpus_is_refused(tmp_path, capsys, monkeypatch):
    a, b = corpora(tmp_path / "a", 0), corpora(tmp_path / "b", 1)
    same = tmp_path / "same-as-a"
    shutil.copytree(a, same)
    out = tmp_path / "out"
    run = tiny_run(out, "--tasks", "ruler_niah_single_2")  # a needle in the essays
    assert main([*run, "--data-dir", a], capsys)[0] == 0
    refused([*run, "--data-dir", b], capsys, out, "data")  # a complete cell of corpus A is not B's
    monkeypatch.setenv("ELASTIC_BENCH_DATA", str(b))
    refused(run, capsys, out, "data")
    monkeypatch.delenv("ELASTIC_BENCH_DATA")
    kept = files(out)
    assert main([*run, "--data-dir", same], capsys)[0] == 0  # the same contents elsewhere: the same cell, kept
    assert files(out) == kept
    unfinish(out)
    refused([*run, "--data-dir", b], capsys, out, "data")  # an interrupted cell of A is not resumed on B


def test_the_data_of_a_hub_dataset_is_its_commit(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from elastic_bench.tasks import corpora, ruler_data

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    squad = ruler_data.source("squad")
    assert corpora.identity(squad, tmp_path) is None  # nowhere: the cell will fail, naming the file
    ref = tmp_path / "hub" / f"datasets--{squad.hub_rows[0].replace('/', '--')}" / "refs" / "main"
    ref.parent.mkdir(parents=True)
    ref.write_text("3f2a9c1b\n")
    assert corpora.identity(squad, tmp_path) == f"{squad.hub_rows[0]}@3f2a9c1b"
    local = tmp_path / "ruler" / "squad.json"
    local.parent.mkdir()
    local.write_text('{"data": []}')
    assert corpora.identities((squad,), tmp_path) == {"ruler/squad.json": digest(local)}  # a local file first


# ---- the model's files -----------------------------------------------------------------------------------------------


def model_copy(folder: Path, noise: bool) -> None:
    """The testbed's weights, configuration and tokenizer in ``folder``; with ``noise``, its embeddings perturbed."""
    from safetensors.torch import load_file, save_file

    folder.mkdir(parents=True)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TESTBED / name, folder / name)
    weights = load_file(TESTBED / "model.safetensors")
    if noise:
        key = next(k for k in weights if "embed" in k)
        weights[key] = weights[key] + 0.5
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def test_two_model_folders_at_the_same_path_are_two_models(tmp_path, capsys, monkeypatch):
    model_copy(tmp_path / "a" / "my-model", noise=False)
    model_copy(tmp_path / "b" / "my-model", noise=True)
    out = tmp_path / "out"
    run = ["run", "--model", "my-model", "--methods", "full", "--tasks", "testbed_niah_single", "--lengths", "640",
           "--limit", "1", "--no-progress", "--device", "cpu", "--output", out]
    monkeypatch.chdir(tmp_path / "a")
    assert main(run, capsys)[0] == 0
    monkeypatch.chdir(tmp_path / "b")
    refused(run, capsys, out, "model_files")
    unfinish(out)
    refused(run, capsys, out, "model_files")


def test_a_model_folder_is_known_by_its_weights_configuration_and_tokenizer(tmp_path):
    from elastic_bench.modeling.loading import model_digest

    model_copy(tmp_path / "m", noise=False)
    first = model_digest(str(tmp_path / "m"))
    (tmp_path / "m" / "notes.md").write_text("not part of the model")
    assert model_digest(str(tmp_path / "m")) == first
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-3}))
    assert model_digest(str(tmp_path / "m")) != first
    assert model_digest("tiny:qwen3") is None  # built from its spec and the code


def test_a_digest_is_read_once_per_content_and_again_after_any_write(tmp_path, monkeypatch):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"a" * 1000)
    reads = []
    monkeypatch.setattr(digests, "digest", lambda p: reads.append(p) or digest(p))
    first = digests.cached_digest(path)
    assert digests.cached_digest(path) == first and len(reads) == 1
    stat = path.stat()
    path.write_bytes(b"b" * 1000)  # the same size, and the same modification time put back
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert digests.cached_digest(path) == digest(path) != first and len(reads) == 2


# ---- the KV cache and the task ---------------------------------------------------------------------------------------


def test_a_cell_of_another_kv_cache_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(tiny_run(out), capsys)[0] == 0  # kv_cache evicting
    refused(tiny_run(out, "--kv-cache", "full"), capsys, out, "kv_cache")
    unfinish(out)
    refused(tiny_run(out, "--kv-cache", "full"), capsys, out, "kv_cache")


def test_a_cell_moved_under_another_task_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    run = ["run", "--model", "testbed", "--methods", "full", "--lengths", "640", "--limit", "1", "--no-progress",
           "--device", "cpu", "--output", out]
    assert main([*run, "--tasks", "testbed_niah_single"], capsys)[0] == 0
    (out / "testbed" / "full" / "testbed_niah_single").rename(out / "testbed" / "full" / "testbed_repeat")
    refused([*run, "--tasks", "testbed_repeat"], capsys, out, "task")


# ---- learned files: read once, loaded as read ------------------------------------------------------------------------


def test_a_router_swapped_after_the_check_is_not_what_the_cell_loads(tmp_path, capsys, monkeypatch):
    from safetensors.torch import load_file, save_file

    from elastic_bench.modeling import loading

    router = tmp_path / "router"
    shutil.copytree(TESTBED / "elastic_router", router)
    (tmp_path / "router_files").mkdir()  # what the run holds of a router folder: its weights and configuration
    for name in ("router.safetensors", "router_config.json"):
        shutil.copy(router / name, tmp_path / "router_files" / name)
    held = digest(tmp_path / "router_files")
    poisoned = {k: torch.full_like(v, float("nan")) for k, v in load_file(router / "router.safetensors").items()}
    real_load = loading.load_model

    def swap_then_load(*args, **kwargs):  # between the run's checks and the method's setup
        save_file(poisoned, router / "router.safetensors")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(loading, "load_model", swap_then_load)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "out"
    code, _ = main(["run", "--model", "testbed", "--methods", "elastic", "-O", f"elastic.router={router}", "--tasks",
                    "testbed_niah_single", "--lengths", "640", "--limit", "1", "--no-progress", "--device", "cpu",
                    "--allow-in-distribution", "--output", out], capsys)  # the router was trained on testbed tasks
    (cell,) = [Cell.at(out, p.parent) for p in out.glob("*/*/*/*/metrics.json")]
    metrics = cell.metrics()
    assert code == 0 and metrics["status"] == "complete"  # the NaN router was never loaded
    assert metrics["fingerprint"]["artifacts"] == {"router": held} != {"router": digest(router)}
    assert not list((tmp_path / "tmp").glob("elastic-bench-held-*"))  # the run's copies are removed


def test_copy_artifact_copies_a_file_or_folder(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "router_config.json").write_text("{}")
    (tmp_path / "src" / "router.safetensors").write_bytes(b"\x00" * 64)
    copy = digests.copy_artifact(tmp_path / "src", tmp_path / "held")
    assert copy == tmp_path / "held" / "src" and digest(tmp_path / "src") == digest(copy)
    copy = digests.copy_artifact(tmp_path / "src" / "router_config.json", tmp_path / "held" / "file")
    assert copy.read_text() == "{}" and digest(copy) == hashlib.sha256(b"{}").hexdigest()


def test_a_router_is_held_as_its_weights_and_configuration_alone(tmp_path):
    """A training folder's log and resume state, or a released model's other weights, are neither copied nor part of
    the router's digest: the same routers give the same digest wherever they were read from."""
    from safetensors.torch import load_file, save_file

    from elastic_bench import get_method
    from elastic_bench.method import RouterConfig, load_routers

    trained = tmp_path / "trained"
    shutil.copytree(TESTBED / "elastic_router", trained)
    (trained / "train_state.json").write_text("{}")
    elastic = get_method("elastic", router=str(trained))
    copy = elastic.hold("router", trained, tmp_path / "held" / "a")
    assert sorted(p.name for p in copy.iterdir()) == ["router.safetensors", "router_config.json"]
    assert filecmp.cmp(copy / "router.safetensors", trained / "router.safetensors", shallow=False)
    shipped = elastic.hold("router", TESTBED / "elastic_router", tmp_path / "held" / "b")  # no state, no log
    assert digest(copy) == digest(shipped)

    released = tmp_path / "released"  # the released models' layout: routers inside the model's weights
    released.mkdir()
    bank = RouterConfig(2, 2, 16).build()
    other = {"model.embed_tokens.weight": torch.zeros(8, 4)}  # a released model's other weights
    save_file({**bank.hf_state_dict(), **other}, str(released / "model.safetensors"))
    (released / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_size": 64,
        "toggle_type": "xattn", "retrieval_mode": "full", "use_softmax": True}))
    copy = elastic.hold("router", released, tmp_path / "held" / "c")
    assert sorted(p.name for p in copy.iterdir()) == ["router.safetensors", "router_config.json"]
    moved = shutil.copytree(released, tmp_path / "elsewhere" / "released")
    assert digest(elastic.hold("router", moved, tmp_path / "held" / "d")) == digest(copy)
    assert "model.embed_tokens.weight" not in load_file(copy / "router.safetensors")
    assert all(torch.equal(load_routers(copy).hf_state_dict()[k], v) for k, v in bank.hf_state_dict().items())
