"""Benchmark records read from a corpus file: a JSON list (or an object whose ``data`` is one), JSON lines, or parquet
(through pyarrow, the ``hub`` extra); or, for a source with hub rows, those rows (through ``datasets``).

`load` is what the benchmarks of 2026 (NoLiMa, BABILong, MRCR, GraphWalks, HELMET, LongBench Pro) read their records
with: the file under the data directory, else its hub copy (`corpora.fetch`), else the hub rows; every failure is one
line naming the file to provide.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import corpora
from .corpora import Source, fetch

Record = dict[str, Any]


def read_records(path: Path) -> list[Record]:
    """The records of the file ``path`` (by its suffix: ``.parquet``, ``.jsonl``, else JSON).

    Raises:
        ValueError: the file is not readable as records (names the file).
    """
    stat = path.stat()
    return list(_read(str(path), stat.st_mtime_ns, stat.st_size))


@lru_cache(maxsize=2)  # the last two files (an MRCR needle count is two parquet files)
def _read(path: str, mtime_ns: int, size: int) -> tuple[Record, ...]:
    try:
        if path.endswith(".parquet"):
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise ValueError(f"reading {path} needs pyarrow: pip install 'elastic-bench[hub]'") from None
            return tuple(pq.read_table(path).to_pylist())
        text = Path(path).read_text(encoding="utf-8")
        if path.endswith(".jsonl"):
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            records = json.loads(text)
            if isinstance(records, dict) and isinstance(records.get("data"), list):
                records = records["data"]
    except (OSError, ValueError) as err:  # not UTF-8, not JSON, not parquet, unreadable
        raise ValueError(f"{path} is not a readable records file ({type(err).__name__}: {err})") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError(f"{path} does not hold a list of JSON objects")
    return tuple(records)


def load(source: Source, data_dir) -> list[Record]:
    """The records of ``source``: its file under the data directory or its hub copy, else its hub rows.

    Raises:
        FileNotFoundError: none of them can be had (the message names the file to provide and where).
        ValueError: the file is not a records file.
    """
    try:
        return read_records(fetch(source, data_dir))
    except FileNotFoundError as missing:
        if source.hub_rows is None:
            raise
        repo, config, split = source.hub_rows
        try:
            return corpora.hub_rows(repo, config, split)
        except Exception as err:  # noqa: BLE001  (offline, no `datasets`, a changed dataset: provide the file)
            raise FileNotFoundError(f"{missing} (the hub dataset {repo} could not be read either: "
                                    f"{type(err).__name__})") from None


def select(records: Iterable[tuple[str, Record]], build: Callable[[Record, str], Any], limit: int | None) -> list:
    """What ``build(record, id)`` makes of ``(id, record)`` pairs, in order, skipping None, until ``limit`` (None: all);
    records after the last one taken are not built."""
    result = []
    for record_id, record in records:
        if limit is not None and len(result) >= limit:
            break
        built = build(record, record_id)
        if built is not None:
            result.append(built)
    return result


def fields(record: Record, names: tuple[str, ...], task: str, index: int) -> list[Any]:
    """The values of ``names`` in ``record``, or one ValueError naming the task, the record and the missing field."""
    try:
        return [record[name] for name in names]
    except (KeyError, TypeError) as err:
        raise ValueError(f"{task}: record {index} lacks the field {err}") from None
