"""The testbed tasks, registered as ``testbed_<name>`` (group ``testbed``, and ``testbed_sensitive`` /
``testbed_robust`` by family), scored like RULER (``string_match_all``).

Prompts are the training prompts exactly (`elastic_bench.testbed.generators`): with the testbed tokenizer the sample
is ``<s>`` + prompt ids and fills the target length to the token. Any other tokenizer gets the same text (decoded
with the testbed vocabulary), re-tokenised, with the haystack shortened until prompt plus budget fit the length.
"""

from __future__ import annotations

import math

from elastic_bench.tasks.base import GROUPS, Sample, Task, register, render
from elastic_bench.tasks.ruler import score

from .generators import MAX_NEW_TOKENS, SPECS, Generator, TaskSpec, sample_rng
from .vocab import build

DEFAULT_SAMPLES = 100


class TestbedTask(Task):
    """A testbed task; subclasses set ``spec``."""

    spec: TaskSpec

    def samples(self, tokenizer, length: int, limit: int | None = None, seed: int = 42) -> list[Sample]:
        vocab = build()
        generator = Generator(vocab)
        result = []
        for index in range(limit if limit is not None else DEFAULT_SAMPLES):
            target = length
            while True:  # shrink the testbed-token length until the rendered prompt fits
                try:
                    example = generator.example(self.spec, sample_rng(seed, self.spec.name, index), target)
                except ValueError:
                    raise ValueError(f"{self.name}: target length {length} is too short for the template") from None
                ids = render(tokenizer, vocab.decode(example.user), " " + vocab.decode(example.prefix))
                excess = len(ids) + MAX_NEW_TOKENS - length
                if excess <= 0:
                    break
                target -= max(1, math.ceil(excess * target / (len(ids) + MAX_NEW_TOKENS)))
            metadata = {"length": length, "category": self.spec.category}
            result.append(Sample(f"{index}", ids, MAX_NEW_TOKENS, [example.reference(vocab)], metadata))
        return result

    def score(self, prediction: str, sample: Sample) -> float:
        return score("all", prediction, sample.references)


for _spec in SPECS.values():
    _name = f"testbed_{_spec.name}"
    register(_name, group="testbed")(
        type(f"Testbed_{_spec.name}", (TestbedTask,), {"spec": _spec, "identities": _spec.identities,
                                                        "__doc__": f"Testbed {_spec.category} task {_spec.name!r} "
                                                        "(elastic_bench.testbed.generators)."})
    )
    GROUPS.setdefault(f"testbed_{_spec.category}", []).append(_name)
