"""Packaging: the package folders are discovered, never listed, so a new folder cannot be left out of the wheel.

The pillars beside ``elastic_bench/`` (``method/``, ``kernels/``, ``tasks/``, ``reports/``) install under its
namespace, as pyproject.toml's ``[tool.setuptools.package-dir]`` maps them; every folder with an ``__init__.py`` below
a mapped folder is a package of the same name path. Everything else is declared in pyproject.toml.
"""

from setuptools import find_namespace_packages, find_packages, setup
from setuptools.config.pyprojecttoml import read_configuration


def discovered_packages() -> list[str]:
    """Every code package (a folder with ``__init__.py``), and every folder of package data (``data/`` below a
    package: listed as a namespace package, so that its files install as data rather than as a folder that Python
    could import but setuptools would not know)."""
    folders = read_configuration("pyproject.toml", expand=False)["tool"]["setuptools"]["package-dir"]
    found = []
    for package, folder in folders.items():
        below = find_packages(folder) + find_namespace_packages(folder, include=["data", "data.*", "*.data",
        "*.data.*"])
        found += [package, *(f"{package}.{sub}" for sub in below)]
    return sorted(set(found))


setup(packages=discovered_packages())
