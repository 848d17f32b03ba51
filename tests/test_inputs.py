"""Inputs that cannot hurt: every bad input a user can give ends in one line naming what was expected, with exit
status 2 (1 for a bug), before any model loads where it can be checked without one."""

from __future__ import annotations

import json

import pytest
import torch
from fixtures.cli import main, one_line, tiny_run

from elastic_bench import cli, get_method
from elastic_bench.evaluation.commands import _method_options

# ---- 1. --debug, internal errors -----------------------------------------------------------------------------------


def test_user_errors_are_one_line_and_reraise_with_debug(capsys, no_model):
    code, err = main(["run", "--device", "gpu"], capsys)
    assert code == 2
    assert one_line(err) == "elastic-bench: error: device must be cpu, cuda or cuda:N (e.g. cuda:0), got 'gpu'"
    with pytest.raises(ValueError, match="got 'gpu'"):
        cli.main(["--debug", "run", "--device", "gpu"])


def test_a_bug_is_one_line_with_exit_status_1_and_reraises_with_debug(capsys, monkeypatch):
    def broken():
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr("elastic_bench.tasks.names", broken)  # what the `tasks` command calls
    code, err = main(["tasks"], capsys)
    assert code == 1
    assert one_line(err) == ("elastic-bench: internal error: RuntimeError: boom second line "
                             "(rerun with --debug for the traceback)")
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["--debug", "tasks"])


def test_interrupt_is_exit_status_130(capsys, monkeypatch):
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr("elastic_bench.tasks.names", interrupted)  # what the `tasks` command calls
    code, err = main(["tasks"], capsys)
    assert code == 130 and "interrupted" in one_line(err)


# ---- 2. method option ranges, checked when the method is built ---------------------------------------------------


@pytest.mark.parametrize("method,option,message", [
    ("streaming", "local=0", "streaming.local must be >= 1, got 0"),
    ("streaming", "sink=-1", "streaming.sink must be >= 0, got -1"),
    ("duo_attention", "sparsity=1.5", "duo_attention.sparsity must lie in [0, 1] (or be None), got 1.5"),
    ("duo_attention", "local=0", "duo_attention.local must be >= 1, got 0"),
    ("prulong", "seed=-1", "prulong.seed must be >= 0, got -1"),
    ("duo_attention", "pattern=/no/such/gates.tsv", "duo_attention.pattern: no file or folder at /no/such/gates.tsv"),
    ("xattention", "threshold=2", "xattention.threshold must lie in [0, 1], got 2.0"),
    ("xattention", "threshold=.nan", "xattention.threshold must be a number, got '.nan'"),
    ("xattention", "threshold=nan", "xattention.threshold must be a number, got 'nan'"),
    ("xattention", "stride=0", "xattention.stride must be >= 1, got 0"),
    ("xattention", "stride=3", "xattention.stride must divide xattention.block_size (128), got 3"),
    ("elastic", "xa_threshold=-0.1", "elastic.xa_threshold must lie in [0, 1], got -0.1"),
    ("elastic", "local=0", "elastic.local must be >= 1, got 0"),
    ("elastic", "sink=-4", "elastic.sink must be >= 0, got -4"),
])
def test_method_option_ranges_are_checked_when_the_method_is_built(capsys, no_model, method, option, message):
    code, err = main(["run", "--methods", method, "-O", f"{method}.{option}"], capsys)
    assert code == 2 and one_line(err).startswith(f"elastic-bench: error: {message}")


def test_get_method_checks_ranges_too():
    with pytest.raises(ValueError, match=r"^streaming.local must be >= 1, got 0$"):
        get_method("streaming", local=0)
    with pytest.raises(ValueError, match=r"^xattention.stride must be >= 1, got 0$"):
        get_method("xattention", stride=0)


def test_one_option_given_two_values_is_refused_not_overwritten(capsys, no_model):
    """``-O elastic.router=a -O elastic.router=b`` would evaluate ``b`` alone; a sweep is one run per value."""
    code, err = main(["run", "--methods", "elastic", "-O", "elastic.router=a", "-O", "elastic.router=b"], capsys)
    assert code == 2 and one_line(err).startswith("elastic-bench: error: -O elastic.router is given twice ('a', then "
                                                  "'b'); a run evaluates one value per option")
    assert _method_options(["streaming.local=64", "streaming.local=64"]) == {"streaming": {"local": "64"}}  # text,
    # which the method reads by the option's type


# ---- 3. gate files ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,message", [
    ("0.1\t0.2\n0.3\tnan\n", "holds a non-finite gate (nan) at layer 1, KV head 1"),
    ("0.1\tinf\n0.3\t0.4\n", "holds a non-finite gate (inf) at layer 0, KV head 1"),
    ("", "is empty; expected a tab-separated table of gates"),
    ("  \n\n", "is empty; expected a tab-separated table of gates"),
    ("0.1\tabc\n", "is not a tab-separated table of numbers"),
    ("0.1\t0.2\n0.3\n", "is not a tab-separated table of numbers"),
])
def test_bad_gate_files_are_one_clear_error_naming_the_file(tmp_path, text, message):
    from elastic_bench.baselines.gates import load_gates

    path = tmp_path / "full_attention_heads.tsv"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        load_gates(tmp_path)
    assert str(path) in str(err.value) and message in str(err.value) and "\n" not in str(err.value)
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ValueError, match="is not a tab-separated table of numbers"):
        load_gates(path)


def test_a_nan_gate_file_is_refused_before_the_model_loads(tmp_path, capsys, no_model):
    gates = tmp_path / "gates.tsv"
    gates.write_text("0.1\tnan\n0.2\t0.3\n")
    code, err = main(tiny_run(tmp_path / "out", "--methods", "duo_attention", "-O", f"duo_attention.pattern={gates}"),
                     capsys)
    assert code == 2 and f"{gates} holds a non-finite gate (nan) at layer 0, KV head 1" in one_line(err)
    assert not (tmp_path / "out").exists()


# ---- 4. elastic without a router ---------------------------------------------------------------------------------


def test_elastic_without_a_router_is_refused_and_untrained_is_explicit(tmp_path, capsys):
    code, err = main(tiny_run(tmp_path / "out", "--methods", "elastic"), capsys)  # refused before the model loads
    assert code == 2 and one_line(err) == (
        "elastic-bench: error: elastic: no router checkpoint for model (built-in): pass -O elastic.router=DIR, or "
        "router=untrained to run untrained routers on purpose")
    assert not (tmp_path / "out").exists()
    code, _ = main(tiny_run(tmp_path / "out2", "--methods", "elastic", "-O", "elastic.router=untrained"), capsys)
    metrics = json.loads(next((tmp_path / "out2").glob("*/*/*/*/metrics.json")).read_text())
    assert code == 0 and metrics["status"] == "complete"
    assert (tmp_path / "out2" / "tiny-qwen3" / "elastic-router=untrained").is_dir()


def test_a_missing_router_directory_is_refused_when_the_method_is_built(tmp_path, capsys, no_model):
    code, err = main(["run", "--methods", "elastic", "-O", f"elastic.router={tmp_path / 'nope'}"], capsys)
    assert code == 2
    assert one_line(err) == (f"elastic-bench: error: elastic.router: router checkpoint {tmp_path / 'nope'} is not a "
                             "directory (expected a router checkpoint directory, or untrained)")
    code, err = main(["run", "--methods", "elastic", "-O", f"elastic.router={tmp_path}"], capsys)
    assert code == 2 and "holds neither router_config.json (elastic-bench) nor config.json" in one_line(err)


# ---- 5. corrupt artifacts ------------------------------------------------------------------------------------------


def _router(tmp_path):
    from elastic_bench.method import RouterConfig, save_routers

    return save_routers(RouterConfig(2, 2, 16).build(), tmp_path / "router")


@pytest.mark.parametrize("file,content,message", [
    ("router.safetensors", b"\x00garbage", "is not a readable safetensors file"),
    ("router.safetensors", b"", "is not a readable safetensors file"),
    ("router_config.json", b'{"num_layers": 2, "num_kv', "is not valid JSON"),
    ("router_config.json", b"[1, 2]", "must hold a JSON object, got list"),
    ("router_config.json", b'{"num_layers": "two", "num_kv_heads": 2, "head_dim": 16}',
     "num_layers must be an integer"),
    ("router_config.json", b'{"num_layers": 2}', "is not a router config written by elastic-bench"),
])
def test_a_corrupt_router_checkpoint_is_one_line_naming_the_file(tmp_path, file, content, message):
    from elastic_bench.method import load_routers

    path = _router(tmp_path)
    (path / file).write_bytes(content)
    with pytest.raises(ValueError) as err:
        load_routers(path)
    assert str(path / file) in str(err.value) and message in str(err.value) and "\n" not in str(err.value)


def test_a_corrupt_router_is_refused_naming_the_file_before_the_model_loads(tmp_path, capsys, no_model):
    path = _router(tmp_path)
    (path / "router.safetensors").write_bytes(b"\x00garbage")
    code, err = main(tiny_run(tmp_path / "out", "--methods", "elastic", "-O", f"elastic.router={path}"), capsys)
    assert code == 2 and f"{path / 'router.safetensors'} is not a readable safetensors file" in one_line(err)
    assert not (tmp_path / "out").exists()


def test_a_corrupt_metrics_file_is_one_line_from_report(tmp_path, capsys, no_model):
    cell = tmp_path / "run" / "m" / "full" / "t" / "1024"
    cell.mkdir(parents=True)
    for content in ('{"status": "compl', "[1]", "\xff"):
        (cell / "metrics.json").write_text(content, encoding="latin-1")
        code, err = main(["report", tmp_path / "run"], capsys)
        assert code == 2 and f"{cell / 'metrics.json'} is not a cell's metrics.json" in one_line(err)
    assert not (tmp_path / "run" / "report").exists()


@pytest.mark.parametrize("content", [b"", b"\x10\x00\x00\x00\x00\x00\x00\x00{not json", b"\x00" * 64])
def test_a_corrupt_training_state_is_one_line_naming_the_file(tmp_path, content):
    from elastic_bench.training.engine import STATE_TENSORS, read_state

    (tmp_path / STATE_TENSORS).write_bytes(content)
    with pytest.raises(ValueError) as err:
        read_state(tmp_path)
    assert f"{tmp_path / STATE_TENSORS} is corrupt or truncated" in str(err.value) and "\n" not in str(err.value)


def test_train_router_refuses_a_corrupt_training_state_in_one_line(tmp_path, capsys):
    from elastic_bench.training.engine import STATE_TENSORS

    (tmp_path / STATE_TENSORS).write_bytes(b"garbage")
    code, err = main(["train-router", "--model", "tiny:qwen3", "--data", "synthetic", "--output", tmp_path, "--steps",
                      "1", "--pack-tokens", "1024", "--synthetic-samples", "4", "--eval-samples", "1", "--device",
                      "cpu", "--no-progress"], capsys)
    assert code == 2
    assert one_line(err).startswith(f"elastic-bench: error: {tmp_path / STATE_TENSORS} is corrupt or truncated")
    assert (tmp_path / STATE_TENSORS).read_bytes() == b"garbage"


def test_a_training_state_record_that_is_not_json_is_one_line(tmp_path):
    from safetensors.torch import save_file

    from elastic_bench.training.engine import STATE_TENSORS, read_state

    save_file({"x": torch.zeros(1)}, str(tmp_path / STATE_TENSORS), metadata={"state": "{trunc"})
    with pytest.raises(ValueError, match="record is not valid JSON"):
        read_state(tmp_path)


# ---- 6. devices ------------------------------------------------------------------------------------------------------

DEVICE_COMMANDS = [
    ["run"], ["train-router"], ["testbed", "eval"], ["testbed", "probe"], ["bench", "kernel"],
    ["testbed", "heads", "--output", "{tmp}/gates.tsv"], ["testbed", "train", "--output", "{tmp}/tb"],
]


@pytest.mark.parametrize("command", DEVICE_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_missing_cuda_device_is_refused_before_a_model_loads(tmp_path, capsys, monkeypatch, no_model, command):
    command = [w.format(tmp=tmp_path) for w in command]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, err = main([*command, "--device", "cuda"], capsys)
    assert code == 2 and one_line(err) == "elastic-bench: error: no CUDA device: torch.cuda.is_available() is False"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    code, err = main([*command, "--device", "cuda:3"], capsys)
    assert code == 2 and one_line(err) == "elastic-bench: error: cuda:3 does not exist (2 devices)"
    code, err = main([*command, "--device", "gpu"], capsys)
    assert code == 2 and "device must be cpu, cuda or cuda:N" in one_line(err)


def test_device_map_auto_without_a_gpu_is_refused_in_one_line(tmp_path, capsys, monkeypatch, no_model):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, err = main(["run", "--device-map", "auto", "--output", tmp_path / "out"], capsys)
    assert code == 2 and one_line(err) == ("elastic-bench: error: --device-map auto spreads a model over this host's "
                                           "GPUs, and it has none (torch.cuda.is_available() is False): leave it out "
                                           "to run on the CPU")


@pytest.mark.parametrize("argv,message", [
    (["--methods", "full,dense"], "methods: 'full' and 'dense' name the same method, with the same options (result "
                                  "folder full); give it once"),
    (["--methods", "streaming,streaming"], "methods: 'streaming' given twice"),
    (["--lengths", "1K,1024"], "lengths gives 1024 tokens more than once"),
])
def test_a_cell_given_twice_is_refused_before_any_work(tmp_path, capsys, no_model, argv, message):
    code, err = main(["run", "--output", tmp_path / "out", *argv], capsys)
    assert code == 2 and message in one_line(err)
    assert not any(tmp_path.iterdir())


def test_two_options_of_one_method_under_its_two_names_are_two_configurations():
    from elastic_bench.evaluation.runner import RunConfig

    config = RunConfig(methods=["duo_attention", "duo"], method_options={"duo": {"sparsity": 0.7}})
    assert [config.label(m) for m in config.build_methods()] == ["duo_attention", "duo_attention-sparsity=0.7"]


def test_load_model_checks_the_device():
    from elastic_bench.modeling.loading import check_device, load_model

    assert check_device("cpu") == torch.device("cpu") and check_device("meta", meta=True).type == "meta"
    with pytest.raises(ValueError, match="got 'cuda:x'"):
        load_model("tiny:qwen3", device="cuda:x")


# ---- 7. output paths, seeds ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["run"], ["train-router"], ["testbed", "train"], ["report", "{tmp}"]],
                         ids=lambda c: " ".join(c[:2]))
def test_an_output_folder_that_is_a_file_is_refused(tmp_path, capsys, no_model, command):
    command = [w.format(tmp=tmp_path) for w in command]
    taken = tmp_path / "taken"
    taken.write_text("a file")
    code, err = main([*command, "--output", taken], capsys)
    assert code == 2 and one_line(err) == f"elastic-bench: error: --output {taken} is a file; expected a folder"
    code, err = main([*command, "--output", taken / "inside"], capsys)
    assert code == 2 and f"lies inside {taken}, which is a file" in one_line(err)
    assert taken.read_text() == "a file"


@pytest.mark.parametrize("command", [["testbed", "data"], ["testbed", "heads"], ["bench", "kernel"]],
                         ids=" ".join)
def test_an_output_file_that_is_a_folder_is_refused(tmp_path, capsys, no_model, command):
    code, err = main([*command, "--output", tmp_path], capsys)
    assert code == 2 and one_line(err) == f"elastic-bench: error: --output {tmp_path} is a folder; expected a file name"


@pytest.mark.parametrize("command", [["testbed", "data", "--output", "{tmp}/r.jsonl"], ["train-router"],
                                     ["testbed", "train", "--output", "{tmp}/tb"], ["bench", "kernel"]],
                         ids=lambda c: " ".join(c[:2]))
def test_negative_seeds_are_refused(tmp_path, capsys, no_model, command):
    command = [w.format(tmp=tmp_path) for w in command]
    code, err = main([*command, "--seed", "-5"], capsys)
    assert code == 2 and one_line(err).startswith("elastic-bench: error: ") and "seed must be >= 0" in err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("argv,message", [
    (["testbed", "data", "--output", "{tmp}/r.jsonl", "--samples", "0"], "--samples must be >= 1, got 0"),
    (["testbed", "data", "--output", "{tmp}/r.jsonl", "--lengths", "512,-4"], "--lengths must be positive token"),
    (["testbed", "eval", "--local", "0"], "--local must be >= 1, got 0"),
    (["testbed", "probe", "--length", "0"], "--length must be >= 1, got 0"),
    (["train-router", "--max-minutes", "-1"], "max_minutes must be > 0, got -1.0"),
])
def test_command_ranges_are_checked_before_any_work(tmp_path, capsys, no_model, argv, message):
    code, err = main([w.format(tmp=tmp_path) for w in argv], capsys)
    assert code == 2 and message in one_line(err)
    assert not any(tmp_path.iterdir())

