"""The README's two make targets: `make demo` installs no system package; `make test` installs the browser its page
tests need, saying so, or says that they will be skipped. Read from make's dry run of each target, nothing executed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry_run(target: str, tmp_path: Path) -> str:
    """The commands ``make TARGET`` runs on a fresh clone (a virtualenv not made yet), printed, not run."""
    done = subprocess.run(["make", "-n", "-B", target, f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_demo_installs_no_system_package(tmp_path):
    commands = dry_run("demo", tmp_path)
    assert "elastic-bench demo" in commands and "pip install" in commands
    assert not any(word in commands for word in ("apt-get", "apt ", "sudo", "chromium"))


def test_make_test_installs_the_browser_or_says_the_browser_tests_skip(tmp_path):
    commands = dry_run("test", tmp_path)
    assert "apt-get install -y -qq chromium" in commands and "pytest" in commands
    assert "installing Chromium for the report page's browser tests" in commands
    assert "the browser tests will be skipped" in commands
