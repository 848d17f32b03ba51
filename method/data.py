"""Router training data: records → examples (tokenised and packed by `elastic_bench.training`); and a synthetic
generator for quick runs.

Record formats (JSONL, one object per line, or parquet; a directory means all its ``*.jsonl`` / ``*.parquet``):
- plain: ``{"prompt": str, "answer": str, "category": str}``;
- official (``LCM-Lab/Elastic-Attention`` ``dataset_packing.py``): ``{"context": str, "question": str,
  "answer": str, "metadata": {"task": str, "is_prefix": bool}}``. The user turn is ``"\\n" + question`` and
  ``"\\n" + context`` joined by a newline, question first when ``is_prefix`` (the default); Summarization is
  wrapped as "You are given several news passages. Write a one-page summary of all news." … "\\n\\nSummary:", Code
  is prefixed with "Please complete the code given below.". The category is ``metadata["task"]``.

Design decisions:
- Every category must have a target: unknown categories are rejected, never mapped to a default.
- Tokenisation (chat template, middle truncation), packing and the LM-loss targets are generic and live in
  `elastic_bench.training` (`tokenize`, `pack`).
"""

from __future__ import annotations

import ast
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Paper §4.1: the five task labels of the training mixture and their target ΩMSR (t_sen = 0.7, t_rob = 1.0), plus
# the two generic category names of the synthetic generator and the testbed.
DEFAULT_TARGETS: dict[str, float] = {
    "Single QA": 0.7,
    "MultiHop QA": 0.7,
    "Summarization": 1.0,
    "Code": 1.0,
    "In-Context Learning": 1.0,
    "sensitive": 0.7,
    "robust": 1.0,
}
SUMMARY_PREFIX = "You are given several news passages. Write a one-page summary of all news."
CODE_PREFIX = "Please complete the code given below."


@dataclass(frozen=True)
class Example:
    """One training example: the user prompt, the reference answer and its task category."""

    prompt: str
    answer: str
    category: str


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Records of a ``.jsonl`` or ``.parquet`` file, or of every such file in a directory (sorted by name)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"training data {path} does not exist")
    files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".parquet")) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"{path} holds no .jsonl or .parquet files")
    records: list[dict[str, Any]] = []
    for file in files:
        if file.suffix == ".parquet":
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise ValueError("reading parquet needs pyarrow: pip install 'elastic-bench[train]'") from None
            records.extend(pq.read_table(file).to_pylist())
        elif file.suffix == ".jsonl":
            with file.open() as handle:
                for number, line in enumerate(handle, 1):
                    if line.strip():
                        try:
                            records.append(json.loads(line))
                        except json.JSONDecodeError as err:
                            raise ValueError(f"{file}:{number}: not a JSON object ({err.msg})") from None
        else:
            raise ValueError(f"training data must be .jsonl or .parquet, got {file}")
    return records


def to_example(record: dict[str, Any], where: str = "record") -> Example:
    """Normalise a plain or official record (see the module docstring) to an `Example`."""
    if "prompt" in record:
        missing = [k for k in ("prompt", "answer", "category") if not isinstance(record.get(k), str)]
        if missing:
            raise ValueError(f"{where}: plain records need string fields prompt, answer, category; bad: {missing}")
        return Example(record["prompt"], record["answer"], record["category"])
    if "context" in record or "question" in record:
        meta = record.get("metadata") or {}
        if isinstance(meta, str):
            meta = ast.literal_eval(meta)
        task = meta.get("task")
        if not isinstance(task, str):
            raise ValueError(f"{where}: official records need metadata.task (the category)")
        context = "\n" + (record.get("context") or "").replace("\ufeff", "").rstrip()
        question = "\n" + (record.get("question") or "").replace("\ufeff", "").lstrip()
        user = question + "\n" + context if meta.get("is_prefix", True) else context + "\n" + question
        if task == "Summarization":
            user = SUMMARY_PREFIX + user + "\n\nSummary:"
        elif task == "Code":
            user = CODE_PREFIX + user
        return Example(user, (record.get("answer") or "").replace("\ufeff", ""), task)
    raise ValueError(f"{where}: expected fields prompt/answer/category or context/question/answer/metadata")


def load_examples(path: str | Path, targets: dict[str, float]) -> list[Example]:
    """Examples of the records at ``path``; every category must be a key of ``targets``."""
    examples = [to_example(r, f"{path} record {i + 1}") for i, r in enumerate(read_records(path))]
    check_categories(examples, targets)
    return examples


def check_categories(examples: Iterable[Example], targets: dict[str, float]) -> list[str]:
    """The categories present (in ``targets`` order); raises for a category without a target."""
    present = {e.category for e in examples}
    unknown = sorted(present - set(targets))
    if unknown:
        raise ValueError(
            f"categories {unknown} have no target ΩMSR; known: {sorted(targets)} (add --target NAME=VALUE)"
        )
    if not present:
        raise ValueError("no training examples")
    return [c for c in targets if c in present]


# ---- synthetic generator -------------------------------------------------------------------------------------------

_WORDS = (
    "river stone cloud amber forest lantern harbor meadow copper signal violet orbit canyon ember willow quartz "
    "saddle thistle marble falcon garden beacon pepper timber ripple summit velvet walnut"
).split()


def synthetic_records(num: int, length: int = 400, seed: int = 0) -> list[dict[str, str]]:
    """Plain records of two categories for quick runs and tests, about ``length`` characters of prompt each.

    - ``"sensitive"``: key–value retrieval; code lines are spread over the first half of a noise haystack and the
      question at the end asks for the code of one key (long-range attention matters).
    - ``"robust"``: continue a story written in capitals; the answer repeats the last sentence (local attention
      suffices).

    The two categories differ in their instructions and their alphabet, so even a tiny random model's pooled keys
    tell them apart.
    """
    rng = random.Random(seed)
    records = []
    for i in range(num):
        sentences, size = [], 0
        while size < length:
            sentence = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 8))) + "."
            sentences.append(sentence)
            size += len(sentence) + 1
        if i % 2 == 0:
            keys = rng.sample(_WORDS, 3)
            codes = [str(rng.randint(1000, 9999)) for _ in keys]
            for key, code in zip(keys, codes):
                sentences.insert(rng.randrange(len(sentences) // 2 + 1), f"The code of {key} is {code}.")
            k = rng.randrange(len(keys))
            prompt = "Find the code. " + " ".join(sentences) + f" Question: what is the code of {keys[k]}?"
            records.append({"prompt": prompt, "answer": codes[k], "category": "sensitive"})
        else:
            sentences = [s.upper() for s in sentences]
            prompt = "CONTINUE THE STORY. " + " ".join(sentences) + " REPEAT THE LAST SENTENCE."
            records.append({"prompt": prompt, "answer": sentences[-1], "category": "robust"})
    return records
