"""The baselines Elastic Attention is compared with, each a registered method: ``full``, ``streaming``,
``duo_attention``, ``prulong`` and ``xattention``.

Adding a method: a dataclass subclassing `elastic_bench.modeling.interface.Method` in its own module, decorated with
``@register_method("name")``, imported below (or, outside this package, listed under the ``elastic_bench.methods``
entry-point group), with tests under ``tests/`` and a line in the README's method table.
"""

from . import duo_attention, full, prulong, streaming, xattention  # noqa: F401  (registration)
