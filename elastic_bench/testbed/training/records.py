"""Router-training records from the testbed generators (``elastic-bench testbed data``).

One JSON object a line: ``{"prompt": str, "answer": str, "category": "sensitive" | "robust", "task": str,
"identities": [str]}`` (the task's generator, as the registered task declares it: `TaskSpec.identities`). The
prompt is the evaluation prompt as text (user turn and answer prefix; the testbed tokenizer adds ``<s>`` and has no
chat template, so ``tokenizer(prompt)`` gives exactly the prompt ids the model was trained on); the answer is the
continuation the model produces before ``</s>``. Seeds differ from the evaluation's (42), so no record is an
evaluation prompt.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from elastic_bench.foundation.files import atomic_path

from ..generators import SPECS, Generator, sample_rng
from ..vocab import build


def records(lengths: list[int], samples: int, seed: int = 1) -> Iterator[dict[str, Any]]:
    """``samples`` records per task and length, tasks interleaved."""
    vocab = build()
    generator = Generator(vocab)
    for length in lengths:
        for index in range(samples):
            for name, spec in SPECS.items():
                example = generator.example(spec, sample_rng(seed + length, name, index), length)
                yield {
                    "prompt": vocab.decode(example.user) + " " + vocab.decode(example.prefix),
                    "answer": vocab.decode(example.answer),
                    "category": spec.category,
                    "task": f"testbed_{name}",
                    "identities": sorted(spec.identities),
                }


def write_records(path: str | Path, lengths: list[int], samples: int, seed: int = 1) -> int:
    """Write `records` to ``path`` (JSONL, atomically); returns how many."""
    count = 0
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        for record in records(lengths, samples, seed):
            f.write(json.dumps(record) + "\n")
            count += 1
    return count
