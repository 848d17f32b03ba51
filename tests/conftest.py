"""Shared fixtures: tiny random models (built once per session) and the GPU skip."""

from __future__ import annotations

import pytest
import torch

# One torch thread per test process (the subprocesses that tests start set OMP_NUM_THREADS=1 alike): the tests' models
# are tiny, and on the 2-core machine a second thread cost four times the CPU time for the same work (three tests of
# test_runner.py: 61 s of user time against 14 s), its threads waiting for each other.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_models():
    """``{"qwen3": (model, tokenizer), "llama": (model, tokenizer)}`` in fp32 on the CPU."""
    from elastic_bench.modeling.loading import load_model

    return {arch: load_model(f"tiny:{arch}", dtype=torch.float32, device="cpu") for arch in ("qwen3", "llama")}


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a command loads a model: these inputs must be refused before."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("elastic_bench.modeling.loading.load_model", refuse)


@pytest.fixture
def offline_hub(monkeypatch):
    """No Hugging Face hub: a corpus missing from the data directory stays missing."""
    from elastic_bench.tasks import corpora

    def offline(*args):
        raise ConnectionError("offline test")

    monkeypatch.setattr(corpora, "hub_download", offline)
    monkeypatch.setattr(corpora, "hub_rows", offline)
