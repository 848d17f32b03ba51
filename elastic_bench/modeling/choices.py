"""The model side's choices that configs offer, each declared once as a `Literal`: the option parser checks values
against it and prints it in ``--help``, ``typing.get_args`` lists it. Imports neither torch nor transformers, so a
config that offers one (`elastic_bench.evaluation.runner.RunConfig`) stays cheap to import."""

from __future__ import annotations

from typing import Literal

KVCache = Literal["evicting", "full", "dynamic"]
"""What a generation inside `elastic_bench.apply` decodes with: ``evicting`` (a `PackedCache` whose streaming heads keep
sink + window only), ``full`` (a `PackedCache` keeping every token; streaming heads decode by mask, as upstream) or
``dynamic`` (transformers' `DynamicCache`, attended by the prefill kernels)."""

METHODS_GROUP = "elastic_bench.methods"
"""The entry-point group that declares every method name and alias (`elastic_bench.foundation.registry.declared`
reads it without importing a method, `elastic_bench.modeling.interface.REGISTRY` loads from it)."""
