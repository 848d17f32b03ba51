"""One resolution of a dtype name (`elastic_bench.kernels.torch_dtype`), with one wording of its error, for every
config that names a dtype."""

from __future__ import annotations

import pytest
import torch

from elastic_bench.kernels import DTYPES, torch_dtype
from elastic_bench.method.trainer import RouterTrainConfig


def test_each_name_gives_its_torch_dtype():
    assert [torch_dtype(name) for name in DTYPES] == [torch.bfloat16, torch.float16, torch.float32]
    assert torch_dtype(None) is None  # the loader's default


@pytest.mark.parametrize("name", ["float33", "int8", "float64", "Tensor"])
def test_any_other_name_is_refused_in_one_line_naming_the_choices(name):
    with pytest.raises(ValueError, match=rf"^dtype must be bfloat16, float16 or float32, got '{name}'$"):
        torch_dtype(name)


def test_the_router_trainer_refuses_it_with_the_same_words():
    with pytest.raises(ValueError, match=r"^dtype must be bfloat16, float16 or float32, got 'fp8'$"):
        RouterTrainConfig(model="tiny:qwen3", data="testbed", dtype="fp8")
