"""Training records: the two formats a trainer reads, each record an `Example` (tokenised and packed by
`elastic_bench.training.engine`).

Record formats (JSONL, one object per line, or parquet; a directory means all its ``*.jsonl`` / ``*.parquet``):
- plain: ``{"prompt": str, "answer": str, "category": str}`` (what ``elastic-bench testbed data`` writes);
- official (``LCM-Lab/Elastic-Attention`` ``dataset_packing.py``): ``{"context": str, "question": str,
  "answer": str, "metadata": {"task": str, "is_prefix": bool}}``. The user turn is ``"\\n" + question`` and
  ``"\\n" + context`` joined by a newline, question first when ``is_prefix`` (the default); Summarization is
  wrapped as "You are given several news passages. Write a one-page summary of all news." … "\\n\\nSummary:", Code
  is prefixed with "Please complete the code given below.". The category is ``metadata["task"]``.

Read by the router trainer (`elastic_bench.method.data`) and the gate trainers (`elastic_bench.baselines.training`).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
