"""Training records: the two formats a trainer reads, each record an `Example` (tokenised and packed by
`elastic_bench.training.engine`).

Record formats (JSONL, one object per line, or parquet; a directory means all its ``*.jsonl`` / ``*.parquet``):
- plain: ``{"prompt": str, "answer": str, "category": str}`` (what ``elastic-bench testbed data`` writes);
- official (``LCM-Lab/Elastic-Attention`` ``dataset_packing.py``): ``{"context": str, "question": str,
  "answer": str, "metadata": {"task": str, "is_prefix": bool}}``. The user turn is ``"\\n" + question`` and
  ``"\\n" + context`` joined by a newline, question first when ``is_prefix`` (the default); Summarization is
  wrapped as "You are given several news passages. Write a one-page summary of all news." … "\\n\\nSummary:", Code
  is prefixed with "Please complete the code given below.". The category is ``metadata["task"]``.

The paper's released mixture in the official format (`OFFICIAL_MIXTURES`) is found by name (`official_mixture`): a
local copy under the data directory, else the Hugging Face hub.

Read by the router trainer (`elastic_bench.method.data`) and the gate trainers (`elastic_bench.baselines.training`).
Every record is checked as the data it claims to be (`to_example`): a JSON object whose fields have their types, with
a prompt and an answer that are not empty; a bad one is one ValueError naming its file and line (`read_examples`).
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_bench.foundation.files import parse_json, read_lines

SUMMARY_PREFIX = "You are given several news passages. Write a one-page summary of all news."
CODE_PREFIX = "Please complete the code given below."

PAPER_LABELS: dict[str, str] = {
    "Single QA": "sensitive",
    "MultiHop QA": "sensitive",
    "Summarization": "robust",
    "Code": "robust",
    "In-Context Learning": "robust",
}
"""The five task labels of the paper's training mixture (§4.1; method.md §5) and their category."""

OFFICIAL_MIXTURES = ("LCM_group/qwen_mix_sft_64K6", "LCM_group/llama_mix_sft_64K6")
"""The paper's training mixture, one per tokenizer family, as ModelScope names them."""
OFFICIAL_IDENTITIES = frozenset({"dataset:chatqa2_long_sft", "dataset:musique", "dataset:colt_132k",
                                 "dataset:gov_report", "dataset:xsum"})
"""The sources of the official mixture (paper §4.1), as task identities (`elastic_bench.tasks.Task.identities`):
LongBench's musique and gov_report share two of them."""


@dataclass(frozen=True)
class Example:
    """One training example: the user prompt, the reference answer and its task category."""

    prompt: str
    answer: str
    category: str


def record_files(path: str | Path) -> list[Path]:
    """The files `read_records` reads at ``path``: the file, or a directory's ``.jsonl`` / ``.parquet`` files (sorted
    by name)."""
    path = Path(path)
    return sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".parquet")) if path.is_dir() else [path]


def files_sha256(folder: Path, files: list[Path]) -> str:
    """SHA-256 of the training data ``files`` (`elastic_bench.results.digests`: a file's bytes, or for a folder's
    files their names under ``folder`` and digests; each read once per content)."""
    from elastic_bench.results.digests import cached_digest, files_digest

    return cached_digest(files[0]) if files == [folder] else files_digest(folder, files)


def read_records(path: str | Path) -> list[Any]:
    """Records of a ``.jsonl`` or ``.parquet`` file, or of every such file in a directory (sorted by name); each JSON
    line at most `elastic_bench.foundation.files.MAX_LINE_BYTES`."""
    return [record for _, record in located_records(path)]


def read_examples(path: str | Path) -> list[Example]:
    """The records at ``path`` (`read_records`) as examples (`to_example`), a bad record named by its file and
    line."""
    return [to_example(record, where) for where, record in located_records(path)]


def located_records(path: str | Path) -> list[tuple[str, Any]]:
    """``(where, record)`` of every record at ``path``: ``FILE:LINE`` of a JSON line, ``FILE row N`` of a parquet
    row."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"training data {path} does not exist")
    files = record_files(path)
    if not files:
        raise FileNotFoundError(f"{path} holds no .jsonl or .parquet files")
    records: list[tuple[str, Any]] = []
    for file in files:
        if file.suffix == ".parquet":
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise ValueError("reading parquet needs pyarrow: pip install 'elastic-bench[train]'") from None
            records.extend((f"{file} row {i + 1}", row) for i, row in enumerate(pq.read_table(file).to_pylist()))
        elif file.suffix == ".jsonl":
            for number, line, _ in read_lines(file):
                if line.strip():
                    try:
                        records.append((f"{file}:{number}", parse_json(line.decode("utf-8"))))
                    except (ValueError, UnicodeDecodeError) as err:
                        raise ValueError(f"{file}:{number}: not a JSON object ({err})") from None
        else:
            raise ValueError(f"training data must be .jsonl or .parquet, got {file}")
    return records


def to_example(record: Any, where: str = "record") -> Example:
    """Normalise a plain or official record (see the module docstring) to an `Example`.

    Raises:
        ValueError: the record is not a JSON object, a field has the wrong type, or its prompt or answer is empty (one
            line starting with ``where``).
    """
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
    if "prompt" in record:
        bad = [k for k in ("prompt", "answer", "category") if not isinstance(record.get(k), str)]
        if bad:
            raise ValueError(f"{where}: plain records need string fields prompt, answer, category; bad: {bad}")
        return _filled(Example(record["prompt"], record["answer"], record["category"]), record["prompt"], where)
    if "context" in record or "question" in record:
        meta = _metadata(record.get("metadata"), where)
        texts = {k: "" if record.get(k) is None else record[k] for k in ("context", "question", "answer")}
        bad = [k for k, v in texts.items() if not isinstance(v, str)]
        if bad:
            raise ValueError(f"{where}: official records need string fields context, question, answer; bad: {bad}")
        task = meta["task"]
        context = "\n" + texts["context"].replace("\ufeff", "").rstrip()
        question = "\n" + texts["question"].replace("\ufeff", "").lstrip()
        user = question + "\n" + context if meta.get("is_prefix", True) else context + "\n" + question
        if task == "Summarization":
            user = SUMMARY_PREFIX + user + "\n\nSummary:"
        elif task == "Code":
            user = CODE_PREFIX + user
        return _filled(Example(user, texts["answer"].replace("\ufeff", ""), task), texts["context"] + texts["question"],
                       where)
    raise ValueError(f"{where}: expected fields prompt/answer/category or context/question/answer/metadata")


def _metadata(meta: Any, where: str) -> dict[str, Any]:
    """An official record's metadata (a mapping, or its Python literal as a string) with a string ``task`` and a bool
    ``is_prefix`` where given."""
    if isinstance(meta, str):
        try:
            meta = ast.literal_eval(meta)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise ValueError(f"{where}: metadata is a string that is not a literal mapping") from None
    meta = meta or {}
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: metadata must be an object with task (the category), got {type(meta).__name__}")
    if not isinstance(meta.get("task"), str):
        raise ValueError(f"{where}: official records need metadata.task (the category)")
    if not isinstance(meta.get("is_prefix", True), bool):
        raise ValueError(f"{where}: metadata.is_prefix must be true or false, got {meta['is_prefix']!r}")
    return meta


def _filled(example: Example, given: str, where: str) -> Example:
    """``example``, refused when the record's own prompt text ``given`` or its answer is empty (nothing to learn)."""
    empty = [name for name, text in (("prompt", given), ("answer", example.answer)) if not text.strip()]
    if empty:
        raise ValueError(f"{where}: its {' and '.join(empty)} is empty; a training record needs a prompt and an "
                         "answer")
    return example


def record_task(record: dict[str, Any]) -> tuple[str, str | None]:
    """``(task, category)`` of a record that `to_example` reads: a plain record's ``task`` (its category when it has
    none) and category; an official record's label and the label's category (`PAPER_LABELS`)."""
    if "prompt" in record:
        return record.get("task") or record["category"], record["category"]
    label = _metadata(record.get("metadata"), "record")["task"]
    return label, PAPER_LABELS.get(label)


def official_mixture(name: str, data_dir: str | None = None) -> Path:
    """The folder holding the parquet files of the official mixture ``name`` (`OFFICIAL_MIXTURES`): ``<data
    directory>/<name>/`` when it holds any (the data directory: ``data_dir``, else ``$ELASTIC_BENCH_DATA``), else
    the hub's copy of the dataset repository ``name`` (downloaded once into the Hugging Face cache), unless
    ``HF_HUB_OFFLINE`` is set.

    Raises:
        FileNotFoundError: neither holds it (one line: what to download, and where to put it).
    """
    from elastic_bench.tasks.corpora import ENV_VAR, data_root

    root = data_root(data_dir)
    if root is not None and official_files(root / name):
        return root / name
    why = "HF_HUB_OFFLINE is set"
    if os.environ.get("HF_HUB_OFFLINE", "").upper() not in ("1", "ON", "YES", "TRUE"):
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(name, repo_type="dataset", allow_patterns=["*.parquet", "**/*.parquet"]))
            if official_files(folder):
                return folder
            why = "the hub's copy holds no parquet file"
        except Exception as err:  # noqa: BLE001  (offline, not on the hub, gated: all mean "provide it locally")
            why = f"the hub did not serve it: {type(err).__name__}"
    where = root / name if root is not None else Path("DATA") / name
    unset = "" if root is not None else f" and pass --data-dir DATA (or set {ENV_VAR})"
    raise FileNotFoundError(f"the official mixture {name} is not here ({why}): download its parquet files from "
                            f"https://modelscope.cn/datasets/{name} into {where}/{unset}")


def official_files(folder: Path) -> list[Path]:
    """The parquet files of an official mixture's ``folder``, at any depth (sorted by path)."""
    return sorted(folder.rglob("*.parquet"))


def read_official(folder: Path) -> list[dict[str, Any]]:
    """The records of every parquet file below ``folder`` (`official_files`)."""
    return [record for file in official_files(folder) for record in read_records(file)]
