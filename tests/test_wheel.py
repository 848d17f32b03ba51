"""The wheel, as a user installs it: built from the tree, installed (not editable) into a throwaway environment that
reuses the installed dependencies, and used from outside the source tree. Every package folder of the tree is in it,
every module imports, and a `run` decodes through the packed, evicting KV cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

IMPORT_ALL = """
import importlib, json, pkgutil, sys
import elastic_bench
failed = {}
names = ["elastic_bench"] + [m.name for m in pkgutil.walk_packages(elastic_bench.__path__, "elastic_bench.")
                             if not m.name.endswith("__main__")]  # running the command line is not importing it
for name in names:
    try:
        importlib.import_module(name)
    except Exception as err:  # noqa: BLE001 (every failure is reported)
        failed[name] = f"{type(err).__name__}: {err}"
print(json.dumps({"file": elastic_bench.__file__, "modules": names, "failed": failed}))
"""


def source_packages() -> set[str]:
    """Every package of the tree (a folder of ``elastic_bench/`` with ``__init__.py``), named as it installs."""
    return {".".join(init.parent.relative_to(REPO).parts) for init in (REPO / "elastic_bench").rglob("__init__.py")
            if "__pycache__" not in init.parts}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh environment holding the wheel; its site-packages sees this environment's packages through a ``.pth``
    line (which runs no ``.pth`` file of theirs, so the editable install of the tree stays out)."""
    work = tmp_path_factory.mktemp("wheel")
    # built from a copy of what the build reads: an in-tree build/ folder keeps the files of modules since moved or
    # deleted, and would pack them
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "elastic_bench", source / "elastic_bench", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(work / "dist"), str(source)], check=True, capture_output=True)
    (wheel,) = (work / "dist").glob("elastic_bench-*.whl")
    env = work / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    target = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            check=True, capture_output=True, text=True).stdout.strip()
    reused = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]  # this environment's, all of them
    Path(target, "reused_dependencies.pth").write_text("\n".join(reused) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True)
    return wheel


def _in_env(wheel: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    bin_dir = wheel.parents[1] / "env" / "bin"
    return subprocess.run([str(bin_dir / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_wheel_holds_every_package_of_the_tree(installed):
    names = zipfile.ZipFile(installed).namelist()
    packaged = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert source_packages() - packaged == set()
    assert any(n.startswith("elastic_bench/data/testbed/") for n in names)  # package data travels too
    assert any(n.startswith("elastic_bench/tasks/data/") for n in names)


def test_every_module_imports_from_the_installed_wheel(installed, tmp_path):
    done = _in_env(installed, "python", "-c", IMPORT_ALL, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert not found["file"].startswith(str(REPO)), "the tree was imported instead of the wheel"
    assert found["failed"] == {}
    assert {"elastic_bench.kernels.decode", "elastic_bench.modeling.kv_cache"} <= set(found["modules"])


def test_run_decodes_through_the_packed_cache_from_the_wheel(installed, tmp_path):
    out = tmp_path / "out"
    done = _in_env(installed, "elastic-bench", "run", "--model", "tiny:llama", "--methods", "streaming",
                   "-O", "streaming.sink=4", "-O", "streaming.local=64", "-O", "streaming.sparse_decode=true",
                   "--tasks", "ruler_niah_single_1", "--lengths", "640", "--limit", "1", "--no-progress",
                   "--output", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (metrics_path,) = out.glob("*/*/*/*/metrics.json")
    metrics = json.loads(metrics_path.read_text())
    assert metrics["status"] == "complete" and metrics["kv_cache"] == "evicting"
    assert metrics["kv_bytes"] < metrics["kv_bytes_full"]  # streaming heads kept sink + window only
