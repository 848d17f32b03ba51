"""Code completion over the Python source of the installed torch package, prompted and scored as LongBench's ``lcc``
(`elastic_bench.tasks.longbench`): a robust task, since the next line of code follows from the lines just above it.
Also the ``mixed_suite`` group: RULER's niah_single_1 and vt (sensitive) with this task (robust).

Design decisions:
- Corpus: every ``.py`` file of the installed ``torch`` package (torch is a dependency, so every machine with the
  project holds it offline), sorted by path, one stream of lines with each file opened by a ``# file: torch/...``
  line (`elastic_bench.tasks.python_source`). Left out: test files (a ``testing`` folder, ``test_*.py``) and files
  that are not UTF-8 or hold a line longer than `LONGEST_LINE` characters. Read once per process (`torch_corpus`).
  Each sample records the corpus it read (``corpus``: ``torch-<version>``, ``corpus_digest``: of the stream read).
- Sample ``index`` for a seed: an answer line drawn uniformly over the corpus's lines that may be asked for, seeded by
  (seed, index); the context is the largest run of lines ending just before it that keeps the prompt within ``length −
  64`` tokens (`elastic_bench.tasks.ruler.largest_fitting`), crossing into the preceding files (after their
  ``# file:`` line) where the answer's own file is too short. The answer is that line as the file has it, its
  indentation kept (LongBench's lcc references keep theirs, and a model continuing the indented context writes it):
  a non-empty line that is not a comment, so the next such line after the context.
- An answer line is code: not in a docstring or inside a string spanning lines (`string_lines`, by Python's own
  parser), and it holds no backtick, ``#`` or ``//`` (Python's floor division): LongBench's code similarity scores
  the first prediction line without them, so a prediction of such a line would be scored by the line after it.
- Prompt, budget and score are LongBench's for lcc: ``dataset2prompt["lcc"]`` with the context, no chat template,
  ``dataset2maxlen["lcc"]`` (64) new tokens, `elastic_bench.tasks.longbench.score` with ``"lcc"`` (fuzzy similarity
  of the first prediction line without a comment to the gold line). Unlike LongBench no middle truncation: the
  context is fitted instead.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from . import python_source
from .base import GROUPS, LengthTooShortError, Sample, Task, register, render
from .longbench import official_config, score
from .ruler import largest_fitting

LONGEST_LINE = 200  # characters: a file with a longer line is left out
SAMPLES = 500  # samples per length without a limit (LongBench's lcc has 500 records)
DATASET = "lcc"  # the LongBench dataset whose prompt, budget and metric the task takes
UNSCORABLE = ("`", "#", "//")  # what the lcc scorer skips a prediction line for: never in an answer line
MIXED_SUITE = ("ruler_niah_single_1", "ruler_vt", "code_completion")
"""The tasks of the ``mixed_suite`` group: RULER's sensitive niah_single_1 and vt, and this robust task."""


@dataclass(frozen=True)
class Corpus:
    """The lines of a package's Python source read as one stream.

    Attributes:
        name: ``<package>-<version>`` (``torch-2.13.0``).
        digest: the first 12 hex digits of the SHA-256 of ``lines`` joined by newlines (paths included).
        paths: each file's path, ``torch/...``, in stream order.
        starts: ``(files,)`` int64: the index in ``lines`` of each file's ``# file:`` line.
        lines: every line of the stream.
    """

    name: str
    digest: str
    paths: tuple[str, ...]
    starts: np.ndarray
    lines: tuple[str, ...]

    def locate(self, index: int) -> tuple[int, int]:
        """The file (its index in ``paths``) of line ``index`` of the stream and its line number there (1-based)."""
        file = int(np.searchsorted(self.starts, index, side="right")) - 1
        return file, index - int(self.starts[file])

    def source(self, file: int) -> str:
        """The text of file ``file`` (its lines as the stream holds them)."""
        end = int(self.starts[file + 1]) if file + 1 < len(self.starts) else len(self.lines)
        return "\n".join(self.lines[int(self.starts[file]) + 1 : end])


def is_test(path: str) -> bool:
    """Whether a package-relative path is a test file: under a ``testing`` folder, or named ``test_*.py``."""
    *folders, name = path.split("/")
    return "testing" in folders or name.startswith("test_")


def string_lines(source: str) -> frozenset[int]:
    """The line numbers (1-based) of ``source`` that are text of a string rather than code: every line of a
    statement that is a string alone (a docstring), and the lines after the first of any string spanning several;
    none for source that does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return frozenset()
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            inside.update(range(node.lineno, node.end_lineno + 1))
        elif isinstance(node, ast.JoinedStr) or isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            inside.update(range(node.lineno + 1, node.end_lineno + 1))
    return frozenset(inside)


@lru_cache(maxsize=1024)
def prose(file: int) -> frozenset[int]:
    """`string_lines` of file ``file`` of `torch_corpus`."""
    return string_lines(torch_corpus().source(file))


def is_answer(line: str) -> bool:
    """Whether a line may be asked for: non-empty, not a comment, and nothing the lcc scorer skips."""
    return bool(line.strip()) and not any(mark in line for mark in UNSCORABLE)


@lru_cache(maxsize=1)
def torch_corpus() -> Corpus:
    """The corpus of the installed torch package's ``.py`` files (module docstring: what is left out).

    Raises:
        FileNotFoundError: torch is not installed as source files.
    """
    spec = importlib.util.find_spec("torch")
    folders = list(spec.submodule_search_locations or []) if spec else []
    if not folders:
        raise FileNotFoundError("code_completion reads the installed torch package's .py files, and none was found")
    package = Path(folders[0])
    root = package.parent
    paths = sorted((p for p in package.rglob("*.py") if not is_test(p.relative_to(root).as_posix())),
                   key=lambda p: p.relative_to(root).as_posix())
    files = python_source.read_files(root, paths, LONGEST_LINE)
    lines = python_source.stream(files)
    starts = np.cumsum([0] + [len(text) + 1 for _, text in files[:-1]], dtype=np.int64)
    if not files:
        raise FileNotFoundError(f"code_completion reads the torch package's .py files, and {package} holds none")
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]
    name = f"torch-{importlib.metadata.version('torch')}"
    return Corpus(name, digest, tuple(path for path, _ in files), starts, lines)


@register("code_completion")
class CodeCompletion(Task):
    """The next line of the torch package's Python source after the lines above it (LongBench lcc's prompt and
    code similarity)."""

    identities = frozenset({"generator:code_completion", "dataset:python_source.torch"})

    def samples(self, tokenizer, length: int, limit: int | None = None, seed: int = 42) -> list[Sample]:
        """``limit`` samples (default `SAMPLES`) whose prompt plus 64 new tokens fits ``length`` tokens."""
        prompts, budgets = official_config()
        template, budget = prompts[DATASET], budgets[DATASET]
        corpus = torch_corpus()
        hint = 2  # the previous sample's context size: where the next search starts

        def encode(answer: int, units: int) -> list[int]:
            context = "\n".join(corpus.lines[answer - units : answer]) + "\n"
            return render(tokenizer, template.format(context=context), chat=False)

        result = []
        for index in range(SAMPLES if limit is None else limit):
            rng = random.Random(f"code_completion:{seed}:{index}")
            while True:  # drawn uniformly over the lines that may be asked for
                answer = rng.randrange(len(corpus.lines))
                file, line = corpus.locate(answer)
                if is_answer(corpus.lines[answer]) and line not in prose(file):
                    break

            def fits(units: int, answer: int = answer) -> bool:
                return units <= answer and len(encode(answer, units)) + budget <= length

            if not fits(1):
                raise LengthTooShortError(
                    f"{self.name}: a target length of {length} tokens is too short: a prompt with one line of code "
                    f"needs {len(encode(answer, 1)) + budget} tokens with this tokenizer, answer budget included")
            hint = largest_fitting(fits, 1, None, hint)
            metadata = {"category": "robust", "length": length, "corpus": corpus.name,
                        "corpus_digest": corpus.digest, "file": corpus.paths[file], "line": line, "context_lines": hint}
            result.append(Sample(f"{index}", encode(answer, hint), budget, [corpus.lines[answer]], metadata))
        return result

    def score(self, prediction: str, sample: Sample) -> float:
        return score(DATASET, prediction, sample.references, None)


GROUPS["mixed_suite"] = list(MIXED_SUITE)  # the RULER tasks register in `ruler`; the group is the suite's order
