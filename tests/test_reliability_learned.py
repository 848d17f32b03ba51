"""Hostile learned files and records (issue 48): router configs, training records, training states and corpora are
checked field by field, each refused in one line naming the file, the field and what is valid; a run that diverges is
an error, and its log stays JSON."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from fixtures.cli import main, one_line, tiny_run
from fixtures.tasks_data import longbench_record, write_longbench
from torch import nn

from elastic_bench.training.engine import STATE_TENSORS, Objective, RunOptions, fit

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


# ---- router configs --------------------------------------------------------------------------------------------------


def _router(tmp_path, **changes):
    from elastic_bench.method import RouterConfig, save_routers

    path = save_routers(RouterConfig(2, 2, 16).build(), tmp_path / "router")
    config = json.loads((path / "router_config.json").read_text())
    attention = {**config["attention"], **changes.pop("attention", {})}
    (path / "router_config.json").write_text(json.dumps({**config, **changes, "attention": attention}))
    return path


@pytest.mark.parametrize("changes,message", [
    ({"attention": {"block_size": 1 << 30}}, "attention.block_size must lie in [1, 1024], got 1073741824"),
    ({"attention": {"sink": -1}}, "attention.sink must lie in [0, 1048576], got -1"),
    ({"attention": {"local": 0}}, "attention.local must lie in [1, 4194304], got 0"),
    ({"attention": {"xa_threshold": 1.5}}, "attention.xa_threshold must lie in [0.0, 1.0], got 1.5"),
    ({"attention": {"xa_stride": 48}}, "attention.xa_stride (48) must divide attention.block_size (128)"),
    ({"attention": {"mode": "fa-fa"}}, "attention.mode must be one of 'fa-ssa', 'fa-xa', 'xa-ssa', got 'fa-fa'"),
    ({"attention": {"sink": "128"}}, "attention.sink must be an integer, got '128'"),
    ({"attention": {"window": 5}}, "unknown key attention.window; valid: attention.mode"),
    ({"format_version": 99}, "format_version must be 1, got 99"),
    ({"format_version": "1"}, "format_version must be 1, got '1'"),
])
def test_a_router_config_field_out_of_range_is_refused_naming_it(tmp_path, capsys, no_model, changes, message):
    path = _router(tmp_path, **changes)
    code, err = main(tiny_run(tmp_path / "out", "--methods", "elastic", "-O", f"elastic.router={path}"), capsys)
    assert code == 2 and f"{path / 'router_config.json'}: {message}" in one_line(err)
    assert not (tmp_path / "out").exists()


def test_unknown_keys_of_the_training_record_are_kept(tmp_path):
    from elastic_bench.method import load_routers

    path = _router(tmp_path, training={"provenance": {"data": "records.jsonl", "anything": [1, 2]}})
    assert load_routers(path).config.training["provenance"]["anything"] == [1, 2]


def test_a_released_configs_attention_fields_are_checked_under_their_names(tmp_path):
    from safetensors.torch import save_file

    from elastic_bench.method import RouterConfig
    from elastic_bench.method.checkpoint import check_router_dir

    folder = tmp_path / "released"
    folder.mkdir()
    save_file(RouterConfig(2, 2, 16).build().hf_state_dict(), str(folder / "model.safetensors"))
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "hidden_size": 64, "block_size": 1 << 30}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json: block_size must lie in \[1, 1024\], got 1073741824$"):
        check_router_dir(folder)


# ---- training records ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("line,message", [
    ("[1, 2]", "a record must be a JSON object, got list"),
    ('"text"', "a record must be a JSON object, got str"),
    ("17", "a record must be a JSON object, got int"),
    ('{"context": "c", "question": "q", "answer": "a", "metadata": [1]}', "metadata must be an object"),
    ('{"context": "c", "question": "q", "answer": "a", "metadata": "{bad"}', "metadata is a string that is not"),
    ('{"context": 5, "question": "q", "answer": "a", "metadata": {"task": "robust"}}', "bad: ['context']"),
    ('{"context": "c", "question": ["q"], "answer": "a", "metadata": {"task": "robust"}}', "bad: ['question']"),
    ('{"context": "c", "question": "q", "answer": {}, "metadata": {"task": "robust"}}', "bad: ['answer']"),
    ('{"context": "c", "question": "q", "answer": "a", "metadata": {"task": "robust", "is_prefix": "no"}}',
     "metadata.is_prefix must be true or false, got 'no'"),
    ('{"prompt": "  ", "answer": "a", "category": "robust"}', "its prompt is empty"),
    ('{"prompt": "p", "answer": "", "category": "robust"}', "its answer is empty"),
    ('{"context": "", "question": "", "answer": "a", "metadata": {"task": "robust"}}', "its prompt is empty"),
    ("[" * 100_000 + "]" * 100_000, "not a JSON object"),
])
def test_a_training_record_of_the_wrong_shape_is_refused_naming_its_file_and_line(tmp_path, line, message):
    from elastic_bench.method.data import DEFAULT_TARGETS, load_examples

    path = tmp_path / "records.jsonl"
    good = json.dumps({"prompt": "p", "answer": "a", "category": "robust"})
    path.write_text(f"{good}\n\n{line}\n")
    with pytest.raises(ValueError) as err:
        load_examples(path, DEFAULT_TARGETS)
    assert str(err.value).startswith(f"{path}:3: ") and message in str(err.value)


def test_a_huge_prompt_is_never_tokenized_whole(tiny_models):
    from elastic_bench.training.engine import CHARS_PER_TOKEN, tokenize
    from elastic_bench.training.records import Example

    _, tokenizer = tiny_models["qwen3"]
    seen = []

    class Measured:  # the real tokenizer, its inputs measured
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def __call__(self, text, **kwargs):
            seen.append(len(text))
            assert len(text) < 4 * CHARS_PER_TOKEN * 64, "a text longer than the sample can be was tokenized"
            return tokenizer(text, **kwargs)

    prompt = "head " + "x" * (2 << 20) + " tail"
    (sample,) = tokenize([Example(prompt, "answer", "robust")], Measured(), ["robust"], 64)
    assert len(sample.input_ids) == 64 and max(seen) < 4 * CHARS_PER_TOKEN * 64
    assert tokenizer.decode(sample.input_ids[:20]).count("head") == 1  # the prompt's two ends are kept
    (whole,) = tokenize([Example(prompt, "answer", "robust")], Measured(), ["robust"], 64, truncate=False)
    assert len(whole.input_ids) > 64  # too long to keep: the packing rule leaves it out


# ---- training states -------------------------------------------------------------------------------------------------


class Line(Objective):
    """A linear regression on the engine: the real loop, state and log, in milliseconds."""

    def __init__(self, lr: float = 0.01):
        torch.manual_seed(0)
        self.net = nn.Linear(3, 2)
        self.modules = {"net": self.net}
        self.optimizer = torch.optim.AdamW(self.net.parameters(), lr=lr)
        self.batches = [torch.ones(3) * (s + 1) for s in range(10)]
        self.clipped, self.grad_clip, self.lr = list(self.net.parameters()), 1e9, lr

    def learning_rate(self, step):
        return self.lr

    def losses(self, step, batch):
        self.loss = self.net(batch).pow(2).sum()
        yield self.loss

    def record(self, step, seconds):
        return {"loss": float(self.loss), "scale": float(self.net.weight.abs().max())}


def _state(tmp_path):
    """A training state after 2 of 4 steps: its path, record and tensors."""
    from safetensors.torch import load_file

    from elastic_bench.training.engine import read_state

    options = RunOptions(output=str(tmp_path / "run"), save_every=2, progress=False)
    fit(Line(), options, 2, {"a": 1})
    record, _ = read_state(options.output)
    return options, record, load_file(str(tmp_path / "run" / STATE_TENSORS))


def _tamper(options, record, tensors):
    from safetensors.torch import save_file

    save_file(tensors, str(options.output + "/" + STATE_TENSORS), metadata={"state": json.dumps(record)})


@pytest.mark.parametrize("tamper,message", [
    (lambda r, t: r.pop("fingerprint"), "fingerprint must be a JSON object (the run's configuration), got None"),
    (lambda r, t: r.update(step=-1), "step must be a whole number in [0, 4], got -1"),
    (lambda r, t: r.update(step=99), "step must be a whole number in [0, 4], got 99"),
    (lambda r, t: r.update(step="2"), "step must be a whole number in [0, 4], got '2'"),
    (lambda r, t: r.update(trained_seconds=float("nan")), "trained_seconds must be a finite number >= 0, got nan"),
    (lambda r, t: r.update(modules=["other"]), "modules must be ['net'] (what this run trains), got ['other']"),
    (lambda r, t: r["optimizer"].update(param_groups=[]), "optimizer.param_groups must hold 1 groups, got 0"),
    (lambda r, t: r["optimizer"].update(param_groups="x"), "optimizer must be a JSON object holding param_groups"),
    (lambda r, t: r["optimizer"]["param_groups"][0].update(params=[0, 7]), "optimizer.param_groups[0].params must"),
    (lambda r, t: r["optimizer"]["param_groups"][0].update(lr="fast"), "optimizer.param_groups[0].lr must be like"),
    (lambda r, t: r["optimizer"]["param_groups"][0].pop("betas"), "optimizer.param_groups[0] must hold the keys"),
    (lambda r, t: r["optimizer"]["param_groups"][0].update(betas=[0.9]), "param_groups[0].betas must be like"),
    (lambda r, t: r["optimizer"].update(state={"x": {}}), "optimizer.state['x'] must be an object of numbers"),
    (lambda r, t: t.update({"net.weight": torch.zeros(5, 5)}), "tensor net.weight is [5, 5], expected [2, 3]"),
    (lambda r, t: t.update({"optimizer.0.exp_avg": torch.zeros(7)}), "tensor optimizer.0.exp_avg is [7], expected"),
    (lambda r, t: t.update({"optimizer.9.exp_avg": torch.zeros(2, 3)}), "optimizer.9.exp_avg belongs to no parameter"),
    (lambda r, t: t.update({"ghost.x": torch.zeros(1)}), "tensor ghost.x belongs to no module of this run (net)"),
    (lambda r, t: t.pop("net.bias"), "tensor net.bias is missing"),
    (lambda r, t: t["net.bias"].fill_(math.inf), "tensor net.bias holds a non-finite value"),
])
def test_a_crafted_training_state_is_refused_naming_the_field(tmp_path, tamper, message):
    options, record, tensors = _state(tmp_path)
    tamper(record, tensors)
    _tamper(options, record, tensors)
    with pytest.raises(ValueError) as err:
        fit(Line(), options, 4, {"a": 1})
    assert str(err.value).startswith(f"{tmp_path / 'run' / STATE_TENSORS}: ") and message in str(err.value)
    assert str(err.value).endswith("delete it (training restarts) or use another --output")


def test_a_state_of_another_configuration_is_named_as_one(tmp_path):
    options, _, _ = _state(tmp_path)
    with pytest.raises(ValueError, match="holds a training run with a different configuration"):
        fit(Line(), options, 4, {"a": 2})
    assert fit(Line(), options, 4, {"a": 1}).done == 4  # an untouched state resumes


# ---- a run that diverges -------------------------------------------------------------------------------------------


def _strict_json(line: str):
    def refuse(token):
        raise ValueError(f"{token} is not JSON")

    return json.loads(line, parse_constant=refuse)


def test_a_diverged_run_is_an_error_and_its_log_stays_json(tmp_path):
    options = RunOptions(output=str(tmp_path / "run"), save_every=1, progress=False)
    with pytest.raises(ValueError, match=r"^training diverged at step \d: net hold non-finite values"):
        fit(Line(lr=1e30), options, 10, {"a": 1})
    log = [_strict_json(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert log and all(isinstance(r["loss"], float) or r["loss"] is None for r in log)
    from elastic_bench.training.engine import json_safe

    assert json_safe({"a": math.nan, "b": [math.inf, 1.0], "c": {"d": -math.inf}}) == \
        {"a": None, "b": [None, 1.0], "c": {"d": None}}


@pytest.mark.slow
def test_train_router_with_an_absurd_learning_rate_is_an_error_not_a_router(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["train-router", "--model", "tiny:qwen3", "--data", "synthetic", "--synthetic-samples", "4",
            "--synthetic-length", "150", "--steps", "3", "--rows-per-step", "1", "--pack-tokens", "1024",
            "--eval-samples", "1", "--sink", "4", "--local-window", "32", "--granularity", "token", "--device", "cpu",
            "--no-progress", "--router-lr", "1e30", "--output", out]
    code, err = main(argv, capsys)
    assert code == 2 and "training diverged at step" in one_line(err) and "routers hold non-finite values" in err
    assert not (out / "router.safetensors").exists()
    assert all(_strict_json(line) for line in (out / "train_log.jsonl").read_text().splitlines())


# ---- corpora ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field,value,message", [
    ("answers", "blue", "answers must be a list of strings, got 'blue'"),
    ("answers", [1], "answers must be a list of strings, got [1]"),
    ("length", "5000", "length must be a whole number of words >= 0, got '5000'"),
    ("length", True, "length must be a whole number of words >= 0, got True"),
    ("all_classes", "a,b", "all_classes must be a list of strings or null, got 'a,b'"),
    ("context", {"text": "x"}, "context must be a string, got dict"),
    ("_id", 3, "_id must be a string, got int"),
])
def test_a_longbench_record_of_the_wrong_shape_is_refused_naming_the_field(tmp_path, tiny_models, field, value,
                                                                           message):
    from elastic_bench import tasks

    record = longbench_record("hotpotqa", 0, 3000, random.Random(0))
    write_longbench(tmp_path, {"hotpotqa_e": [{**record, field: value}]})
    with pytest.raises(ValueError, match=rf"^longbench_e_hotpotqa: record 0: {__import__('re').escape(message)}$"):
        tasks.get("longbench_e_hotpotqa", data_dir=str(tmp_path)).samples(tiny_models["qwen3"][1], 1024)


def test_a_longbench_e_record_with_a_string_length_fails_its_cell_before_generating(tmp_path, capsys, monkeypatch):
    record = longbench_record("hotpotqa", 0, 3000, random.Random(0))
    write_longbench(tmp_path / "data", {"hotpotqa_e": [{**record, "length": "3000"}]})

    def no_generation(*args, **kwargs):
        raise AssertionError("generated")

    monkeypatch.setattr("elastic_bench.modeling.generation.greedy_generate", no_generation)
    code, err = main(["run", "--model", "tiny:qwen3", "--methods", "full", "--tasks", "longbench_e_hotpotqa",
                      "--lengths", "1024", "--data-dir", tmp_path / "data", "--device", "cpu", "--no-progress",
                      "--output", tmp_path / "out"], capsys)
    (metrics,) = (tmp_path / "out").glob("*/*/*/*/metrics.json")
    failed = json.loads(metrics.read_text())
    assert code == 1 and "internal error" not in err
    assert failed["status"] == "failed" and "length must be a whole number of words >= 0, got '3000'" in \
        failed["error"]


@pytest.mark.parametrize("field,value,message", [
    ("answer", "E", "answer must be one of A, B, C, D, got 'E'"),
    ("choice_A", 1, "choice_A must be a string, got int"),
    ("difficulty", None, "difficulty must be a string, got NoneType"),
])
def test_a_longbench_v2_item_of_the_wrong_shape_is_refused_naming_the_field(tmp_path, tiny_models, field, value,
                                                                            message):
    from fixtures.tasks_data import longbench_v2_item

    from elastic_bench import tasks

    (tmp_path / "longbench_v2").mkdir()
    item = {**longbench_v2_item(0, random.Random(0), "easy", "short"), field: value}
    (tmp_path / "longbench_v2" / "data.json").write_text(json.dumps([item]))
    with pytest.raises(ValueError, match=rf"^longbench_v2: item 0: {message}$"):
        tasks.get("longbench_v2", data_dir=str(tmp_path)).samples(tiny_models["qwen3"][1], 2048)


# ---- reports: names that slug alike ----------------------------------------------------------------------------------


def test_models_whose_names_slug_alike_get_plots_of_their_own(tmp_path, capsys):
    from test_reports import _cell

    for model in ("Model.A", "model-a"):
        for method, score in (("full", 60.0), ("streaming", 40.0)):
            _cell(tmp_path / "run", method, "ruler_niah_single_1", 1024, score, 0.0 if method == "full" else 0.5,
                  1.0, model=model)
    from elastic_bench import cli

    capsys.readouterr()
    code = cli.main(["report", str(tmp_path / "run")])
    said = capsys.readouterr().out
    report = tmp_path / "run" / "report"
    pngs = sorted(p.name for p in report.glob("*.png"))
    assert code == 0 and pngs and len(pngs) % 2 == 0 and f"({len(pngs) + 2} files)" in said
    assert {p.removeprefix("model-a-2-") for p in pngs if p.startswith("model-a-2-")} == \
        {p.removeprefix("model-a-") for p in pngs if p.startswith("model-a-") and not p.startswith("model-a-2-")}
    html = (report / "report.html").read_text()
    assert 'id="model-a"' in html and 'id="model-a-2"' in html
