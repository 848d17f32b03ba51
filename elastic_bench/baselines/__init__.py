"""The baselines Elastic Attention is compared with, each a registered method: ``full``, ``streaming``,
``duo_attention``, ``prulong``, ``xattention``, the top-k block methods ``infllm_v2``, ``moba`` and ``nsa``; and
``oracle``, the best block selection at a budget.

Adding a method: a dataclass subclassing `elastic_bench.modeling.interface.Method` in its own module, decorated with
``@register_method("name")``, imported below, its name and each alias declared as an entry point of the
``elastic_bench.methods`` group in pyproject.toml (``name = "module:Class"``; discovery refuses a method registered but
not declared, and names are checked against the declarations without importing torch), with tests under ``tests/``
and a line in the README's method table. A method outside this package is only declared there.
"""

from . import duo_attention, full, infllm_v2, moba, nsa, oracle, prulong, streaming, xattention  # noqa: F401  (registration)
