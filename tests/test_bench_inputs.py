"""``bench decode`` and ``bench prefill`` refuse bad inputs in one line, exit 2, before the model loads; a router
adds the elastic method to either."""

from __future__ import annotations

import pytest

from elastic_bench.bench.decode import DecodeBenchConfig
from elastic_bench.bench.prefill import PrefillBenchConfig
from elastic_bench.cli import main


@pytest.mark.parametrize("command, argv, message", [
    ("decode", ["--router", "/no/such"], "router checkpoint /no/such is not a directory"),
    ("decode", ["--methods", "elastic"], "method elastic needs --router"),
    ("decode", ["--seed", "-1"], "--seed must be >= 0, got -1"),
    ("decode", ["--backend", "bogus"], "unknown attention backend 'bogus'"),
    ("decode", ["--backend", "triton"], "attention backend 'triton' cannot run on cpu"),
    ("prefill", ["--backend", "triton"], "attention backend 'triton' cannot run on cpu"),
])
def test_bad_input_ends_in_one_line_before_the_model_loads(command, argv, message, tmp_path, monkeypatch, capsys):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr("elastic_bench.modeling.loading.load_model", no_model)
    out = tmp_path / "bench.json"
    rc = main(["bench", command, "--model", "tiny:llama", "--device", "cpu", "--lengths", "256", "--no-progress",
               "--output", str(out), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize("config", [DecodeBenchConfig, PrefillBenchConfig])
def test_a_router_adds_the_elastic_method(config):
    assert config(methods=["full"], router="untrained").methods == ["full", "elastic"]
    assert config(methods=["full", "elastic"], router="untrained").methods == ["full", "elastic"]
