"""What every HELMET task shares (princeton-nlp/HELMET @ 4526dfb, MIT: `eval.py`, `model_utils.tokenize`,
`scripts/generate_configs.py`).

- Lengths: HELMET's input lengths are 4K … 128K (4096 … 131072 tokens, prompt plus generation), each with its own
  test file or number of demonstrations; a run at length L reads those of the longest HELMET length ≤ L and fits the
  prompt to L.
- Prompt: ``prompt_template = user_template + "\\n" + system_template`` filled with the item, tokenised with the
  tokenizer's default special tokens (``use_chat_template: false``); or, for the long-document QA tasks, the user
  template alone through the chat template with the generation prompt (``use_chat_template: true``, no system
  message).
- Truncation: when the prompt exceeds ``L − generation_max_length`` tokens, the item's context loses its last
  ``excess`` tokens (cut at the character where the ``excess``-th token from its end starts, by the tokenizer's
  offsets; decoded without them for a slow tokenizer), once.
- Generation: greedy, ``generation_max_length`` new tokens, no stop at a newline (the configurations' key
  ``stop_new_line`` is not the option ``--stop_newline``, so upstream never stops there either).
- Scoring: without the chat template the filled ``system_template`` is prepended to the output, then the task's
  post-processing scores it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import LengthTooShortError, Sample, Task, render
from ..corpora import Source

LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)
HOW = ("It is in data.tar.gz of the princeton-nlp/HELMET dataset on the Hugging Face hub (HELMET's "
       "scripts/download_data.sh); extract it into <data dir>/helmet/ so that helmet/data/ holds its folders.")


def length_index(name: str, length: int) -> int:
    """The index in `LENGTHS` of the HELMET length a run at ``length`` tokens uses."""
    fitting = [i for i, n in enumerate(LENGTHS) if n <= length]
    if not fitting:
        raise LengthTooShortError(f"{name}: a target length of {length} tokens is too short: HELMET's shortest input "
                                  f"length is {LENGTHS[0]} tokens")
    return fitting[-1]


def shuffled(n: int, seed: int) -> list[int]:
    """The order `datasets.Dataset.shuffle(seed=seed)` gives ``n`` rows: ``numpy.random.default_rng(seed)``'s
    permutation."""
    return np.random.default_rng(seed).permutation(n).tolist()


def data_source(path: str) -> Source:
    """A file of HELMET's data.tar.gz, by its path under the archive (``data/...``)."""
    return Source(f"HELMET data file {path}", (f"helmet/{path}",), HOW)


def truncate_end(tokenizer, context: str, excess: int) -> str:
    """``context`` without its last ``excess`` tokens (see the module docstring)."""
    if tokenizer.is_fast:
        offsets = tokenizer([context], return_offsets_mapping=True)["offset_mapping"][0]
        return context[: offsets[-excess][0]] if excess <= len(offsets) else ""
    ids = tokenizer(context).input_ids
    return tokenizer.decode(ids[:-excess]) if excess < len(ids) else ""


class Helmet(Task):
    """A HELMET dataset. Subclasses set the templates and ``generation`` and implement `items` (the test items of
    one HELMET length, in upstream's order, each with ``context`` and ``answer``) and `metric`."""

    user_template = ""
    system_template = ""
    generation = 0
    chat = False
    category = "sensitive"
    identities = frozenset({"dataset:helmet"})

    def items(self, index: int) -> list[dict[str, Any]]:
        raise NotImplementedError

    def metric(self, output: str, sample: Sample) -> float:
        """The task's post-processed score of ``output`` (the prefix already prepended) in [0, 1]."""
        raise NotImplementedError

    def encode(self, tokenizer, item: dict[str, Any]) -> list[int]:
        if self.chat:
            return render(tokenizer, self.user_template.format(**item), chat=True)
        return render(tokenizer, self.user_template.format(**item) + "\n" + self.system_template.format(**item),
                      chat=False)

    def samples(self, tokenizer, length: int, limit: int | None = None, seed: int = 42) -> list[Sample]:
        """The test items of the HELMET length at or below ``length`` (the first ``limit``), fitted to ``length``;
        the seed is HELMET's own (42), not the run's."""
        index = length_index(self.name, length)
        result = []
        for number, item in enumerate(self.items(index)[:limit]):
            ids = self.encode(tokenizer, item)
            excess = len(ids) - (length - self.generation)
            if excess > 0:
                item = {**item, "context": truncate_end(tokenizer, item["context"], excess)}
                ids = self.encode(tokenizer, item)
            prefix = "" if self.chat else self.system_template.format(**item)
            metadata = {"prefix": prefix, "helmet_length": LENGTHS[index], "category": self.category,
                        **{k: item[k] for k in ("qid", "qrel") if k in item}}
            answers = item["answer"] if isinstance(item["answer"], list) else [item["answer"]]
            result.append(Sample(str(number), ids, self.generation, answers, metadata))
        return result

    def score(self, prediction: str, sample: Sample) -> float:
        return self.metric(sample.metadata["prefix"] + prediction, sample)
