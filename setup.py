"""Packaging: the package folders are discovered, never listed, so a new folder cannot be left out of the wheel.

Every folder of ``elastic_bench/`` with an ``__init__.py`` is a package; every ``data/`` folder below a package is
listed as a namespace package, so that its files install as data rather than as a folder that Python could import but
setuptools would not know. Everything else is declared in pyproject.toml.
"""

from setuptools import find_namespace_packages, find_packages, setup


def discovered_packages() -> list[str]:
    """Every code package of ``elastic_bench`` and every folder of package data below one."""
    code = find_packages(include=["elastic_bench", "elastic_bench.*"])
    data = find_namespace_packages(include=["elastic_bench.data", "elastic_bench.data.*", "elastic_bench.*.data",
                                            "elastic_bench.*.data.*"])
    return sorted(set(code + data))


setup(packages=discovered_packages())
