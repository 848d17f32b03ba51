"""What a learned file was trained on: the provenance every trainer writes into it, and the tasks it shares a source
with.

Not the provenance of a run (`elastic_bench.results.provenance`: versions, device, date): this one names the data.
A router's ``router_config.json`` holds it as ``training.provenance``, a gate folder's ``config.json`` (``train-duo``,
``train-prulong``) as ``provenance``, ``TRAINING.json`` of a testbed model as ``provenance``; the shape is one::

    {"data": {"source": "records" | "synthetic" | "official:<mixture name>" | "file",
              "path": <the path as given, or null>, "sha256": <hex of the data file, or of the generated records>,
              "identities": ["generator:records.single_qa", ...], "tasks": {<task>: <category or null>},
              "lengths": [<fewest tokens>, <most tokens>], "records": <records trained on>},
     "steps": <optimizer steps done>, "tokens_seen": <tokens of every sample of every step>,
     "recipe": "paper" | "custom"}

- ``identities`` are those of `elastic_bench.tasks.Task.identities`: a task whose identities meet a learned file's is
  *in-distribution* for it (`shared`). Records carry their own (``identities`` of each record that ``elastic-bench
  records`` and ``testbed data`` write); the official mixture's are the paper's five sources.
- ``sha256``: of the file read (a folder: over its files, `elastic_bench.foundation.files.digest`), of the records
  made in the process (`records_digest`: the bytes ``elastic-bench records`` would write), or, for data generated step
  by step, of what defines it (`definition_digest`: generator, settings, seed, the digest of a corpus it reads).
- ``recipe`` is ``"paper"`` only for the official mixture by name trained for the paper's `PAPER_STEPS` steps: the only
  files a report may call a reproduction.
- A learned file without provenance (older files, the released checkpoints) reads as None: unknown, never refused,
  never a reproduction.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

PAPER_STEPS = 300  # paper Table 6 / App. D.1


def data_provenance(source: str, sha256: str, identities: Iterable[str], tasks: dict[str, str | None],
                    lengths: tuple[int, int], records: int, path: str | None = None) -> dict[str, Any]:
    """The ``data`` block of a provenance: ``records`` records (or samples drawn) of ``lengths`` (fewest, most)
    tokens."""
    return {"source": source, "path": path, "sha256": sha256, "identities": sorted(set(identities)),
            "tasks": dict(sorted(tasks.items())), "lengths": [int(lengths[0]), int(lengths[1])],
            "records": int(records)}


def learned_provenance(data: dict[str, Any], steps: int, tokens_seen: int) -> dict[str, Any]:
    """The provenance of a file trained ``steps`` steps on ``data`` (`data_provenance`), ``tokens_seen`` tokens in
    all."""
    paper = data["source"].startswith("official:") and steps == PAPER_STEPS
    return {"data": data, "steps": steps, "tokens_seen": int(tokens_seen), "recipe": "paper" if paper else "custom"}


def epoch_tokens(sizes: list[int], draws: int, order) -> int:
    """The tokens of the first ``draws`` items drawn from items of ``sizes`` tokens in a fresh permutation per epoch
    (``order(epoch)``: the permutation of epoch ``epoch``), as the trainers visit their samples: every full epoch
    holds each item once."""
    epochs, rest = divmod(draws, len(sizes))
    return epochs * sum(sizes) + sum(sizes[int(i)] for i in order(epochs)[:rest]) if rest else epochs * sum(sizes)


def records_digest(records: Iterable[dict[str, Any]]) -> str:
    """SHA-256 (hex) of ``records`` as JSON Lines, the bytes `elastic_bench.foundation.files.write_jsonl` writes."""
    sha = hashlib.sha256()
    for record in records:
        sha.update((json.dumps(record) + "\n").encode())
    return sha.hexdigest()


def definition_digest(definition: dict[str, Any]) -> str:
    """SHA-256 (hex) of what defines data generated step by step (``definition``, JSON with sorted keys)."""
    return hashlib.sha256(json.dumps(definition, sort_keys=True, default=str).encode()).hexdigest()


def record_identities(records: Iterable[dict[str, Any]]) -> set[str]:
    """The identities the records carry (their ``identities`` fields); records without one add none."""
    return {identity for record in records for identity in record.get("identities") or ()}


def shared(provenance: dict[str, Any] | None, identities: Iterable[str]) -> list[str]:
    """The identities of a task (``identities``) that the data of a learned file's ``provenance`` has too, sorted;
    none for a file of unknown provenance."""
    return sorted(set(identities) & set(provenance["data"]["identities"])) if provenance else []


def check_provenance(value: Any, where: str) -> dict[str, Any] | None:
    """``value`` (a provenance as read from ``where``), checked to have the shape above as far as the held-out rule
    reads it; None stays None.

    Raises:
        ValueError: one line naming ``where`` and the first bad entry.
    """
    if value is None:
        return None
    data = value.get("data") if isinstance(value, dict) else None
    identities = data.get("identities") if isinstance(data, dict) else None
    if not isinstance(identities, list) or not all(isinstance(i, str) for i in identities):
        raise ValueError(f"{where}: provenance.data.identities must be a list of strings (a provenance written by an "
                         f"elastic-bench trainer), got {identities!r}")
    if not isinstance(value.get("recipe"), str) or not isinstance(data.get("source"), str):
        raise ValueError(f"{where}: provenance needs a recipe and a data.source string")
    return value
