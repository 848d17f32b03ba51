"""The README's recipes run as written, on a tiny model with their lengths scaled down.

Each recipe's bash block runs in bash itself (variables, loops and all) with ``elastic-bench`` a shell function that
records its arguments and ``pip`` a no-op; the recorded commands then run in order, in-process, in one folder, with
what makes them small (`scaled`): the model is ``tiny:llama``, every length is 32 times shorter (at least 512 tokens),
``--tasks ruler`` is one RULER task, ``--limit`` is 1, training runs 2 steps on the CPU (the gates' samples at most
1,024 tokens), and ``records`` writes 2 records per category and length. Nothing else of a command line is changed.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from elastic_bench.cli import main
from elastic_bench.reports import load_cells

README = Path(__file__).resolve().parents[1] / "README.md"
END = "\x1e"  # ends one recorded command
RECORD = f'elastic-bench() {{ printf "%s\\0" "$@" >> "$CALLS"; printf "{END}\\0" >> "$CALLS"; }}\npip() {{ :; }}\n'
SMALL = {  # appended to each command: what makes it small (the recipe's own options come first and are kept)
    "run": ["--device", "cpu", "--no-progress"],
    "train-duo": ["--steps", "2", "--max-length", "1024", "--device", "cpu", "--no-progress"],
    "train-prulong": ["--steps", "2", "--max-length", "1024", "--batch-size", "2", "--device", "cpu", "--no-progress"],
    "records": ["--samples", "2", "--lengths", "512,1024", "--no-progress"],
    "train-router": ["--steps", "2", "--rows-per-step", "1", "--pack-tokens", "1024", "--eval-samples", "1",
                     "--device", "cpu", "--no-progress"],
}


def recipe(heading: str) -> str:
    """The first bash block after the line of the README that starts with ``heading``."""
    text = README.read_text()
    start = next(i for i, line in enumerate(text.splitlines()) if line.startswith(heading))
    below = "\n".join(text.splitlines()[start:])
    return re.search(r"```bash\n(.*?)```", below, re.S).group(1)


def recorded(block: str, folder: Path) -> list[list[str]]:
    """The ``elastic-bench`` commands that the bash ``block`` runs, in order, each as its argument list."""
    calls = folder / "calls"
    calls.touch()
    subprocess.run(["bash", "-e", "-c", RECORD + block], cwd=folder, env={**os.environ, "CALLS": str(calls)},
                   check=True)
    words = calls.read_bytes().decode().split("\0")[:-1]
    commands, current = [], []
    for word in words:
        if word == END:
            commands.append(current)
            current = []
        else:
            current.append(word)
    return commands


def _length(text: str) -> str:
    tokens = int(text[:-1]) * 1024 if text.upper().endswith("K") else int(text)
    return str(max(512, tokens // 32))


def scaled(command: list[str]) -> list[str]:
    """``command`` made small (see the module's docstring)."""
    out = list(command)
    for i, word in enumerate(out[:-1]):
        value = out[i + 1]
        if word == "--model":
            out[i + 1] = "tiny:llama"
        elif word in ("--lengths", "--max-length"):
            out[i + 1] = ",".join(map(_length, value.split(",")))
        elif word == "--limit":
            out[i + 1] = "1"
        elif word == "--tasks" and value == "ruler":
            out[i + 1] = "ruler_niah_single_1"
    return out + SMALL.get(out[0], [])


def run_recipe(heading: str, tmp_path: Path, monkeypatch) -> list[list[str]]:
    commands = recorded("M=org/model\n" + recipe(heading), tmp_path)  # a recipe may use the M set above it
    monkeypatch.chdir(tmp_path)
    for command in commands:
        assert main(scaled(command)) == 0, command
    return commands


@pytest.mark.slow
def test_evaluate_your_own_model_runs_as_written(tmp_path, monkeypatch, capsys):
    commands = run_recipe("## Evaluate your own model", tmp_path, monkeypatch)
    assert [c[0] for c in commands] == ["run", "train-duo", "train-prulong", "records", "train-router", "run",
                                        "report"]
    cells = load_cells(tmp_path / "runs" / "mine")
    assert {c.method.split("-")[0] for c in cells} == {"full", "streaming", "xattention", "duo_attention", "prulong",
                                                       "elastic"}
    assert all(c.complete for c in cells) and {c.length for c in cells} == {512, 1024}
    assert (tmp_path / "runs" / "mine" / "report" / "report.md").is_file()
    capsys.readouterr()


@pytest.mark.slow
def test_the_router_target_sweep_runs_as_written(tmp_path, monkeypatch, capsys):
    # the sweep trains on the records, and compares with the gates, of the recipe above
    assert main(["records", "--model", "tiny:llama", "--output", str(tmp_path / "records.jsonl"), "--lengths", "512",
                 "--samples", "2", "--no-progress"]) == 0
    for gates in ("duo", "prulong"):
        output = str(tmp_path / "gates" / gates)
        assert main([f"train-{gates}", *SMALL[f"train-{gates}"], "--model", "tiny:llama", "--output", output]) == 0
    commands = run_recipe("**A router target sweep**", tmp_path, monkeypatch)
    targets = ["0.4", "0.6", "0.8", "0.9", "0.95"]
    assert [c[0] for c in commands] == ["train-router", "run"] * len(targets) + ["run", "report"]
    methods = {c.method for c in load_cells(tmp_path / "sweep" / "run")}
    assert {f"elastic-router=sensitive_{t}" for t in targets} < methods
    report = (tmp_path / "sweep" / "run" / "report" / "report.md").read_text()
    assert all(f"sensitive_{t}" in report for t in targets)
    capsys.readouterr()


def test_a_recipe_is_recorded_with_its_variables_and_loops_expanded(tmp_path):
    block = 'M=org/model\nfor t in 1 2; do\n  elastic-bench run --model $M --tag "a b" --t $t\ndone\n'
    assert recorded(block, tmp_path) == [["run", "--model", "org/model", "--tag", "a b", "--t", t] for t in "12"]
    assert scaled(["run", "--model", "x", "--lengths", "8K,32K", "--limit", "50", "--tasks", "ruler"]) == [
        "run", "--model", "tiny:llama", "--lengths", "512,1024", "--limit", "1", "--tasks", "ruler_niah_single_1",
        *SMALL["run"]]
