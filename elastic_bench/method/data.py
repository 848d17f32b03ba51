"""Router training data: where it comes from (`locate`: the project's records, the synthetic set, the official
mixture by name, a file), records (`elastic_bench.training.records`: the plain and the official formats) → examples
with a target per category (tokenised and packed by `elastic_bench.training.engine`), what the data was
(`data_provenance_of`), and a synthetic generator for quick runs.

Design decisions:
- Every category must have a target: unknown categories are rejected, never mapped to a default.
- Tokenisation (chat template, middle truncation), packing and the LM-loss targets are generic and live in
  `elastic_bench.training.engine` (`tokenize`, `pack`).
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from elastic_bench.training.provenance import data_provenance, record_identities, records_digest
from elastic_bench.training.records import (
    CODE_PREFIX,
    OFFICIAL_IDENTITIES,
    OFFICIAL_MIXTURES,
    PAPER_LABELS,
    SUMMARY_PREFIX,
    Example,
    files_sha256,
    official_files,
    official_mixture,
    read_examples,
    read_official,
    read_records,
    record_files,
    record_task,
    to_example,
)

__all__ = ["CODE_PREFIX", "DEFAULT_TARGETS", "SUMMARY_PREFIX", "Example", "check_categories", "check_targets",
           "data_provenance_of", "load_examples", "locate", "read_data", "read_records", "record_task",
           "synthetic_records", "to_example"]

CATEGORY_TARGETS = {"sensitive": 0.7, "robust": 1.0}  # paper §4.1: t_sen = 0.7, t_rob = 1.0
DEFAULT_TARGETS: dict[str, float] = {
    **{label: CATEGORY_TARGETS[category] for label, category in PAPER_LABELS.items()},
    **CATEGORY_TARGETS,
}
"""Target ΩMSR of the five task labels of the paper's training mixture (its categories'), and of the two category
names that ``elastic-bench records``, the synthetic generator and the testbed label their records with."""
SYNTHETIC_GENERATOR = "generator:records.synthetic"


def locate(data: str, data_dir: str | None = None) -> tuple[str, Path | None]:
    """Where the training data ``data`` (`elastic_bench.method.trainer.RouterTrainConfig.data`) comes from, before any
    model loads: ``(source, path)`` with the source as a provenance names it (`elastic_bench.training.provenance`):
    ``records`` or ``synthetic`` (made in the process, no path), ``official:<name>`` for a name of
    `OFFICIAL_MIXTURES` (the folder of its parquet files: `official_mixture`, under ``data_dir`` or from the hub),
    else ``file`` (the path).

    Raises:
        FileNotFoundError: the official mixture is nowhere to be had, or no file or folder is at ``data``.
    """
    if data in ("records", "synthetic"):
        return data, None
    if data in OFFICIAL_MIXTURES:
        return f"official:{data}", official_mixture(data, data_dir)
    if not Path(data).exists():
        raise FileNotFoundError(f"--data {data}: no such file or folder (records, synthetic, an official mixture: "
                                f"{', '.join(OFFICIAL_MIXTURES)}, or a .jsonl/.parquet file or a folder of them)")
    return "file", Path(data)


def read_data(source: str, path: Path | None) -> list[dict[str, Any]]:
    """The records of a file or official mixture that `locate` found (``records`` and ``synthetic`` are made by the
    trainer)."""
    return read_official(path) if source.startswith("official:") else read_records(path)


def data_provenance_of(source: str, path: Path | None, records: list[dict[str, Any]], lengths: list[int]
                       ) -> dict[str, Any]:
    """The ``data`` block of the provenance (`elastic_bench.training.provenance.data_provenance`) of ``records``
    trained on at ``lengths`` tokens, from ``source`` and ``path`` (`locate`): the digest of the files read
    (`files_sha256`), else of the records; the official mixture's identities are its
    sources (`OFFICIAL_IDENTITIES`), the others' those their records carry."""
    official = source.startswith("official:")
    if path is None:
        sha = records_digest(records)
    else:  # of the files `read_data` reads
        sha = files_sha256(path, official_files(path) if official else record_files(path))
    identities = OFFICIAL_IDENTITIES if official else record_identities(records)
    tasks = dict(record_task(r) for r in records)
    return data_provenance(source, sha, identities, tasks, (min(lengths), max(lengths)), len(records),
                           path=None if path is None else str(path))


def load_examples(path: str | Path, targets: dict[str, float]) -> list[Example]:
    """Examples of the records at ``path`` (a bad record is one ValueError naming its file and line); every category
    must be a key of ``targets``."""
    examples = read_examples(path)
    check_categories(examples, targets)
    return examples


def check_categories(examples: Iterable[Example], targets: dict[str, float]) -> list[str]:
    """The categories present (in ``targets`` order); raises for a category without a target (`check_targets`)."""
    present = {e.category for e in examples}
    check_targets(present, targets)
    return [c for c in targets if c in present]


def check_targets(present: set[str], targets: dict[str, float]) -> None:
    """Refuse training data of the categories ``present`` when one has no target ΩMSR in ``targets``, naming the
    target that looks like a misspelling of it (``--target sensitiv=0.9`` for ``sensitive``).

    Raises:
        ValueError: no category, or one without a target (one line).
    """
    if not present:
        raise ValueError("no training examples")
    unknown = sorted(present - set(targets))
    if not unknown:
        return
    spare = [t for t in targets if t not in present]  # targets of no category of the data
    close = {c: difflib.get_close_matches(c, spare, n=1, cutoff=0.6) for c in unknown}
    hints = [f"--target {match[0]}={targets[match[0]]:g} names no category of the data: did you mean "
             f"--target {c}={targets[match[0]]:g}?" for c, match in close.items() if match]
    raise ValueError(f"categories {unknown} have no target ΩMSR; known: {sorted(targets)} (add --target NAME=VALUE)"
                     + "".join(f"; {hint}" for hint in hints))


# ---- synthetic generator -------------------------------------------------------------------------------------------

_WORDS = (
    "river stone cloud amber forest lantern harbor meadow copper signal violet orbit canyon ember willow quartz "
    "saddle thistle marble falcon garden beacon pepper timber ripple summit velvet walnut"
).split()


def synthetic_records(num: int, length: int = 400, seed: int = 0) -> list[dict[str, str]]:
    """Plain records of two categories for quick runs and tests, about ``length`` characters of prompt each (tasks
    ``synthetic_codes`` and ``synthetic_story``).

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
            records.append({"prompt": prompt, "answer": codes[k], "category": "sensitive", "task": "synthetic_codes",
                            "identities": [SYNTHETIC_GENERATOR]})
        else:
            sentences = [s.upper() for s in sentences]
            prompt = "CONTINUE THE STORY. " + " ".join(sentences) + " REPEAT THE LAST SENTENCE."
            records.append({"prompt": prompt, "answer": sentences[-1], "category": "robust", "task": "synthetic_story",
                            "identities": [SYNTHETIC_GENERATOR]})
    return records
