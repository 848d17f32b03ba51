"""Inputs a careless user or a hostile file gives (issue 39): each is refused in one line before any work, or fails
only what it touches, and nothing is lost."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import subprocess
import sys
import time

import pytest
from fixtures.cli import main, one_line, tiny_run

from elastic_bench.foundation.files import LOCK_FILE, FolderLockedError, exclusive


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


# ---- a lock without a race -----------------------------------------------------------------------------------------


def _contend(folder, trials, start, end, inside, most, taken) -> None:
    """One of the processes of `test_a_stale_lock_taken_over_at_once_has_one_holder`."""
    for _ in range(trials):
        start.wait()
        try:
            with exclusive(folder):
                with inside.get_lock():
                    inside.value += 1
                    most.value = max(most.value, inside.value)
                time.sleep(0.02)
                with inside.get_lock():
                    inside.value -= 1
                with taken.get_lock():
                    taken.value += 1
        except FolderLockedError:
            pass
        end.wait()


def test_a_stale_lock_taken_over_at_once_has_one_holder(tmp_path):
    processes, trials = 4, 30
    context = multiprocessing.get_context("fork")
    start, end = context.Barrier(processes + 1), context.Barrier(processes + 1)
    inside, most, taken = context.Value("i", 0), context.Value("i", 0), context.Value("i", 0)
    stale = json.dumps({"pid": _dead_pid(), "host": os.uname().nodename, "command": "killed"})
    workers = [context.Process(target=_contend, args=(tmp_path, trials, start, end, inside, most, taken))
               for _ in range(processes)]
    for worker in workers:
        worker.start()
    for _ in range(trials):
        (tmp_path / LOCK_FILE).write_text(stale)
        start.wait(timeout=30)
        end.wait(timeout=30)
    for worker in workers:
        worker.join(timeout=30)
    assert all(w.exitcode == 0 for w in workers)
    assert most.value == 1  # never two holders at once
    assert taken.value >= trials  # every trial had a holder
    assert not (tmp_path / LOCK_FILE).exists()


# ---- outputs: never a device, a FIFO or an empty path ----------------------------------------------------------------

FILE_OUTPUT = [["bench", "kernel"], ["bench", "prefill"], ["bench", "decode"], ["testbed", "data"],
               ["testbed", "eval"], ["testbed", "heads"]]
FOLDER_OUTPUT = [["run"], ["demo"], ["train-router"], ["train-duo"], ["train-prulong"], ["testbed", "train"],
                 ["compare", "{tmp}/a", "{tmp}/b"]]


@pytest.mark.parametrize("command", FILE_OUTPUT + FOLDER_OUTPUT, ids=lambda c: " ".join(c[:2]))
def test_an_output_that_is_a_fifo_or_empty_is_refused_and_kept(tmp_path, capsys, no_model, command):
    command = [w.format(tmp=tmp_path) for w in command]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code, err = main([*command, "--output", fifo], capsys)
    assert code == 2 and f"--output {fifo} is a device, FIFO or socket; expected a" in one_line(err)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # never replaced
    code, err = main([*command, "--output", ""], capsys)
    assert code == 2 and one_line(err) == "elastic-bench: error: --output is empty; give a path"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


# ---- numbers: finite -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["train-router", "--router-lr", "inf"], ["train-router", "--lambda-lr", "nan"],
    ["train-router", "--grad-clip", "nan"], ["train-router", "--min-lr-ratio", "nan"], ["train-duo", "--lr", "inf"],
    ["train-prulong", "--mask-lr", "inf"], ["train-router", "--max-minutes", "nan"],
    ["train-router", "--tau-min", "nan"], ["train-prulong", "--betas", "0.9,-inf"],
], ids=lambda argv: " ".join(argv))
def test_a_number_that_is_not_finite_is_refused_before_any_model_loads(tmp_path, capsys, no_model, argv):
    code, err = main([*argv, "--output", tmp_path / "out"], capsys)
    assert code == 2 and f"{argv[1]} takes " in one_line(err) and repr(argv[2].split(",")[-1]) in err
    code, err = main(["run", "--methods", "elastic", "-O", "elastic.xa_threshold=.nan"], capsys)
    assert code == 2 and "xa_threshold must be a number" in one_line(err)
    assert not any(tmp_path.iterdir())


# ---- learned files: checked as data before the model loads ----------------------------------------------------------


def _router(tmp_path):
    from elastic_bench.method import RouterConfig, save_routers

    return save_routers(RouterConfig(2, 2, 16).build(), tmp_path / "router")


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_a_router_holding_non_finite_weights_is_refused_naming_the_file_and_entry(tmp_path, capsys, no_model, poison):
    from safetensors.torch import load_file, save_file

    path = _router(tmp_path)
    weights = path / "router.safetensors"
    tensors = {key: value.fill_(poison) for key, value in load_file(weights).items()}
    save_file(tensors, str(weights))
    code, err = main(tiny_run(tmp_path / "out", "--methods", "elastic", "-O", f"elastic.router={path}"), capsys)
    first = sorted(tensors)[0]  # safetensors lists its tensors sorted by name
    at = [0] * tensors[first].dim()
    assert code == 2 and (f"{weights} holds a non-finite router weight ({poison}) in {first} at {at}; every "
                          "router weight must be a finite number") in one_line(err)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key,value", [("num_layers", 10_000_000), ("hidden_mult", 1_000_000), ("head_dim", 0),
                                        ("num_kv_heads", -1), ("pool_tokens", 1 << 40), ("num_logits", 3)])
def test_a_router_config_out_of_bounds_is_refused_before_anything_is_built(tmp_path, capsys, no_model, key, value):
    from elastic_bench.method.checkpoint import BOUNDS

    path = _router(tmp_path)
    config = json.loads((path / "router_config.json").read_text())
    (path / "router_config.json").write_text(json.dumps({**config, key: value}))
    low, high = BOUNDS[key]
    code, err = main(tiny_run(tmp_path / "out", "--methods", "elastic", "-O", f"elastic.router={path}"), capsys)
    assert code == 2 and one_line(err).endswith(
        f"{path / 'router_config.json'}: {key} must lie in [{low}, {high}], got {value}")


def test_a_router_of_another_shape_than_its_config_is_refused_naming_the_tensor(tmp_path):
    from elastic_bench.method import RouterConfig, save_routers
    from elastic_bench.method.checkpoint import check_router_dir

    path = save_routers(RouterConfig(2, 2, 16, hidden_mult=2).build(), tmp_path / "router")
    config = json.loads((path / "router_config.json").read_text())
    (path / "router_config.json").write_text(json.dumps({**config, "hidden_mult": 4}))
    with pytest.raises(ValueError, match=r"router: layer 0 router does not match 2 layers × 2 KV heads × head_dim 16: "
                                         r"cls_feat_extractor.0.bias is \[32\], expected \[64\]$"):
        check_router_dir(path)
    (path / "router_config.json").write_text(json.dumps({**config, "num_layers": 3}))
    with pytest.raises(ValueError, match=r"holds routers for layers \[0, 1\]; expected layers 0..2$"):
        check_router_dir(path)


# ---- archives: read with a size bound -------------------------------------------------------------------------------


def test_a_zip_member_larger_than_the_bound_is_refused_before_it_is_read(tmp_path):
    import struct
    import zipfile

    from elastic_bench.tasks.longbench import MAX_MEMBER_BYTES, load_records, zip_member

    archive = tmp_path / "longbench" / "data.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
        out.writestr("data/qasper.jsonl", "\n" * 100_000)
    data = bytearray(archive.read_bytes())  # the member's stated size: 3 GiB, in its local and central headers
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = data.index(signature) + offset
        data[at:at + 4] = struct.pack("<I", 3 << 30)
    archive.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"^{archive}: data/qasper.jsonl holds 3,221,225,472 bytes uncompressed, "
                                         rf"more than the {MAX_MEMBER_BYTES:,} a corpus file may hold"):
        load_records("qasper", tmp_path)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:  # a real one, 100 KB inflated from ~100 bytes
        out.writestr("data/qasper.jsonl", "\n" * 100_000)
    with pytest.raises(ValueError, match="holds 100,000 bytes uncompressed, more than the 1,000"):
        zip_member(archive, "data/qasper.jsonl", limit=1000)
    assert load_records("qasper", tmp_path) == []
    archive.write_bytes(b"PK not a zip")
    with pytest.raises(ValueError, match="is not a readable zip archive"):
        load_records("qasper", tmp_path)


# ---- corpora of the wrong shape: their cells fail, the run goes on ---------------------------------------------------


def test_an_essay_corpus_of_the_wrong_shape_fails_its_cells_naming_the_file_and_the_run_goes_on(tmp_path, capsys):
    essays = tmp_path / "data" / "ruler" / "PaulGrahamEssays.json"
    essays.parent.mkdir(parents=True)
    essays.write_text("[]")
    out = tmp_path / "out"
    tasks = ["--tasks", "ruler_niah_single_2,ruler_niah_single_1"]
    code, _ = main([*tiny_run(out, "--data-dir", tmp_path / "data"), *tasks], capsys)
    assert code == 1
    failed = json.loads(next(out.glob("*/*/ruler_niah_single_2/640/metrics.json")).read_text())
    assert failed["status"] == "failed" and f'{essays} is not a JSON object {{"text": "<essays>"}}' in failed["error"]
    assert json.loads(next(out.glob("*/*/ruler_niah_single_1/640/metrics.json")).read_text())["status"] == "complete"


@pytest.mark.parametrize("kind,name,content,message", [
    ("essay", "PaulGrahamEssays.json", '{"text": 5}', "is not a JSON object"),
    ("essay", "PaulGrahamEssays.json", '{"text": " \\n "}', "holds nothing to read"),
    ("essay", "PaulGrahamEssays.json", "{not json", "is not a readable JSON file"),
    ("english_words", "english_words.json", "[]", "is not a JSON object whose values are words"),
    ("english_words", "english_words.json", '{"a": 1}', "holds nothing to read"),
    ("squad", "squad.json", '{"data": 3}', "is not SQuAD v2.0 dev JSON"),
    ("hotpotqa", "hotpotqa.json", "[]", "holds nothing to read"),
])
def test_every_ruler_corpus_of_the_wrong_shape_is_a_value_error_naming_the_file(tmp_path, kind, name, content, message):
    from elastic_bench.tasks import ruler_data

    (tmp_path / "ruler").mkdir()
    (tmp_path / "ruler" / name).write_text(content)
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'ruler' / name} {message}"):
        ruler_data._load(kind, tmp_path)


# ---- user errors before the model loads ------------------------------------------------------------------------------


@pytest.mark.parametrize("device,message", [
    ("meta", "device must be cpu, cuda or cuda:N (e.g. cuda:0), got 'meta'"),
    ("xla", "device must be cpu, cuda or cuda:N (e.g. cuda:0), got 'xla'"),
    ("cpu:7", "the CPU takes no device index: give cpu, got 'cpu:7'"),
])
def test_a_device_that_cannot_run_is_refused_before_the_model_loads(tmp_path, capsys, no_model, device, message):
    from elastic_bench.modeling.loading import check_device

    code, err = main(tiny_run(tmp_path / "out")[:-4] + ["--device", device], capsys)
    assert code == 2 and one_line(err) == f"elastic-bench: error: {message}"
    assert check_device("meta", meta=True).type == "meta"  # what load_model allows: weights without storage


def test_a_model_that_is_not_there_is_one_line_before_anything_runs(tmp_path, capsys, no_model, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = main(["run", "--model", "./my-model", "--device", "cpu"], capsys)
    assert code == 2 and one_line(err) == "elastic-bench: error: no such model folder or file: ./my-model"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network, no retry: the local cache only
    code, err = main(["run", "--model", "nobody-h9/no-such-model", "--device", "cpu"], capsys)
    assert code == 2 and one_line(err) == (
        "elastic-bench: error: hub model nobody-h9/no-such-model is not in the local Hugging Face cache and the hub "
        "cannot be used (HF_HUB_OFFLINE is set): download it where the hub is reachable, or give a local folder")
    assert not any(tmp_path.iterdir())


def test_a_hub_id_without_a_hub_answering_is_one_line_after_one_request(tmp_path, capsys, no_model, monkeypatch):
    import huggingface_hub.utils
    from huggingface_hub import constants

    from elastic_bench.results import digests

    requests = []

    class Unanswered:
        def head(self, url, timeout):
            requests.append((url, timeout))
            raise ConnectionError("no route to host")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.utils, "get_session", Unanswered)
    digests._hub_unreachable.cache_clear()
    code, err = main(["run", "--model", "nobody-h9/no-such-model", "--device", "cpu", "--output", tmp_path / "out"],
                     capsys)
    digests._hub_unreachable.cache_clear()
    assert code == 2 and one_line(err) == (
        "elastic-bench: error: hub model nobody-h9/no-such-model is not in the local Hugging Face cache and the hub "
        f"cannot be used ({constants.ENDPOINT} did not answer: ConnectionError): download it where the hub is "
        "reachable, or give a local folder")
    assert requests == [(constants.ENDPOINT, digests.HUB_TIMEOUT)]  # one request with a short timeout, no retries
    assert not (tmp_path / "out").exists()


def test_a_backend_the_device_cannot_run_is_refused(monkeypatch):
    from elastic_bench.modeling.loading import check_backend

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=r"^attention backend 'triton' cannot run on cpu; available there: auto, "):
        check_backend("triton", "cpu")
    with pytest.raises(ValueError, match="unknown attention backend 'tritn'"):
        check_backend("tritn", "cpu")
    check_backend("auto", "cpu")
    check_backend("reference", "cpu")


def test_a_length_too_short_for_a_task_is_refused_with_its_minimum(tmp_path, monkeypatch):
    from elastic_bench.modeling.loading import load_tokenizer
    from elastic_bench.tasks import LengthTooShortError, check_length

    monkeypatch.setenv("ELASTIC_BENCH_DATA", str(tmp_path))  # no corpora: the essay task's cells will say so
    tokenizer = load_tokenizer("tiny:qwen3")
    names = ["ruler_niah_single_2", "ruler_niah_single_1", "longbench_qasper"]
    with pytest.raises(LengthTooShortError, match=r"^ruler_niah_single_1: a target length of 100 tokens is too "
                                                  r"short: the smallest input \(haystack size 1\) needs \d+ tokens"):
        check_length(names, tokenizer, 100)
    with pytest.raises(LengthTooShortError, match=r"^longbench_qasper: .* it needs at least 502 tokens$"):
        check_length(names[2:], tokenizer, 400)
    check_length(names[:2], tokenizer, 640)


# ---- folder names stay short ---------------------------------------------------------------------------------------


def test_a_learned_file_with_a_long_path_gives_a_short_folder_name(tmp_path, capsys, monkeypatch):
    from elastic_bench import get_method

    folder = tmp_path / ("g" * 120) / ("h" * 120)
    folder.mkdir(parents=True)
    gates = folder / "gates.tsv"
    gates.write_text("1\t0\n0\t1\n")
    assert len(str(gates)) > 230
    code, _ = main(tiny_run(tmp_path / "out", "--methods", "duo_attention", "-O", f"duo_attention.pattern={gates}"),
                   capsys)
    (method,) = [p.name for p in (tmp_path / "out" / "tiny-qwen3").iterdir()]
    assert code == 0 and method.startswith("duo_attention-pattern=gates.tsv~") and len(method) < 64
    other = tmp_path / ("g" * 120) / ("i" * 120) / "gates.tsv"  # the same name elsewhere: another folder
    assert get_method("duo_attention", pattern=str(gates)).label() == method
    other.parent.mkdir()
    other.write_text("1\t0\n0\t1\n")
    assert get_method("duo_attention", pattern=str(other)).label() != method
    # short values keep their labels (the shipped sweep's folder names)
    assert get_method("streaming", sink=16, local=256).label() == "streaming-sink=16-local=256"
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "duo.tsv").write_text("1\t0\n")
    monkeypatch.chdir(tmp_path)
    assert get_method("duo_attention", pattern="g/duo.tsv").label() == "duo_attention-pattern=g%2Fduo.tsv"


# ---- the Markdown report escapes what it did not write -------------------------------------------------------------


def test_the_markdown_report_escapes_markup_from_folder_names_and_fields(tmp_path, capsys):
    from test_reports import _cell

    run = tmp_path / "run"
    for method in ("full", "streaming-sink=<script>alert(1)", "bad<img src=x onerror=alert(1)>"):
        _cell(run, method, "ruler_niah_single_1", 1024, 50.0, 0.3, 1.0)
    _cell(run, "full", "ruler_niah_single_1", 2048, 0, 0, 0, status="failed")
    metrics = next(run.glob("m/full/ruler_niah_single_1/2048/metrics.json"))
    metrics.write_text(json.dumps({**json.loads(metrics.read_text()), "error": "<svg onload=alert(1)>"}))
    code, _ = main(["report", run, "--output", tmp_path / "report"], capsys)
    md = (tmp_path / "report" / "report.md").read_text()
    assert code == 0 and "&lt;svg onload=alert(1)&gt;" in md and "&lt;script&gt;" in md
    assert not any(tag in md for tag in ("<script", "<img", "<svg"))
