"""LongBench-v2 (503 multiple-choice items), as `THUDM/LongBench` @ 2e00731 runs it (`pred.py`, `result.py`).

Prompts are the byte-exact `prompts/0shot.txt` and the chain-of-thought pair `0shot_cot.txt` / `0shot_cot_ans.txt`
(shipped in `data/longbench_v2/prompts/`), filled by ``str.replace``. The filled prompt is truncated in the middle to
a token budget (120,000 by default, lowered so that the run's length holds the prompt and the answer) and sent as one
user message through the tokenizer's chat template. Decoding is greedy (upstream samples at temperature 0.1).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any

from .base import LengthTooShortError, Sample, Task, register, render
from .corpora import Source, fetch

DATA = Source(
    "LongBench-v2 data file",
    ("longbench_v2/data.json",),
    "It is data.json of the THUDM/LongBench-v2 dataset repository on the Hugging Face hub.",
    hub=("THUDM/LongBench-v2", "data.json"),
)
MAX_LEN = 120_000
FIELDS = ("_id", "domain", "sub_domain", "difficulty", "length", "question", "choice_A", "choice_B", "choice_C",
          "choice_D", "answer")


def extract_answer(response: str) -> str | None:
    """The chosen letter of a response, as official: remove every ``*``, then the first
    ``The correct answer is (X)``, else the first ``The correct answer is X`` (case-sensitive, X in A–D), else None."""
    response = response.replace("*", "")
    match = re.search(r"The correct answer is \(([A-D])\)", response) or re.search(
        r"The correct answer is ([A-D])", response
    )
    return match.group(1) if match else None


@lru_cache(maxsize=3)
def prompt_template(name: str) -> str:
    """One of ``0shot``, ``0shot_cot``, ``0shot_cot_ans`` (no trailing newline)."""
    return (resources.files(__package__) / "data" / "longbench_v2" / "prompts" / f"{name}.txt").read_text("utf-8")


def fill(template: str, item: dict[str, Any], context: str = "", cot: str = "") -> str:
    """``pred.py``'s substitution, in its order: ``$DOC$``, ``$Q$``, ``$C_A$``…``$C_D$`` (each stripped), ``$COT$``."""
    text = template.replace("$DOC$", context.strip()).replace("$Q$", item["question"].strip())
    for letter in "ABCD":
        text = text.replace(f"$C_{letter}$", item[f"choice_{letter}"].strip())
    return text.replace("$COT$", cot)


def middle_truncate(tokenizer, prompt: str, max_len: int) -> str:
    """``pred.py``'s truncation: ``ids = encode(prompt)`` (special tokens included); when longer than ``max_len``,
    ``ids[:max_len // 2] + ids[-max_len // 2:]`` (Python floor division: ⌈max_len/2⌉ from the end) decoded as one
    sequence without special tokens."""
    ids = tokenizer.encode(prompt)
    if len(ids) <= max_len:
        return prompt
    return tokenizer.decode(ids[: max_len // 2] + ids[-max_len // 2 :], skip_special_tokens=True)


def load_items(data_dir) -> list[dict[str, Any]]:
    """The items of ``data.json`` (a JSON list)."""
    path = fetch(DATA, data_dir)
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a JSON file ({err.msg})") from None
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected a JSON list of LongBench-v2 items")
    return items


def check_item(item: Any, where: str) -> None:
    """Refuse a LongBench-v2 item that is not what ``pred.py`` and ``result.py`` read: a JSON object whose fields
    (`FIELDS` and ``context``) are strings, its ``answer`` one of A, B, C, D.

    Raises:
        ValueError: one line starting with ``where`` and naming the field.
    """
    if not isinstance(item, dict):
        raise ValueError(f"{where} is not a JSON object")
    for name in (*FIELDS, "context"):
        if name not in item:
            raise ValueError(f"{where} lacks a LongBench-v2 field ({name!r})")
        if not isinstance(item[name], str):
            raise ValueError(f"{where}: {name} must be a string, got {type(item[name]).__name__}")
    if item["answer"] not in ("A", "B", "C", "D"):
        raise ValueError(f"{where}: answer must be one of A, B, C, D, got {item['answer']!r:.80}")


class LongBenchV2(Task):
    """LongBench-v2, direct answer (``0shot``).

    Args:
        data_dir: see `Task`.
        max_len: truncation budget in tokens (official 120,000).
        skip_failed: leave items with an empty response out of every denominator, as upstream does with calls that
            failed; by default they stay and score 0.
        compensated: count an answer that cannot be extracted as 0.25 (``result.py``'s option, off by default).
    """

    cot = False
    sources = (DATA,)
    identities = frozenset({"dataset:longbench_v2"})

    def __init__(self, data_dir=None, max_len: int = MAX_LEN, skip_failed: bool = False, compensated: bool = False):
        super().__init__(data_dir)
        self.max_len, self.skip_failed, self.compensated = max_len, skip_failed, compensated

    @property
    def max_new_tokens(self) -> int:
        return 1024 if self.cot else 128

    def samples(self, tokenizer, length: int, limit: int | None = None, seed: int = 42) -> list[Sample]:
        """Items in file order (the first ``limit``); the seed is unused. The truncation budget is
        ``min(max_len, length − max_new_tokens − chat-template tokens)``."""
        overhead = len(render(tokenizer, ""))
        budget = min(self.max_len, length - self.max_new_tokens - overhead)
        if budget < 2:
            need = length - budget + 2
            raise LengthTooShortError(f"{self.name}: a target length of {length} tokens is too short: the answer "
                                      f"budget and the chat template need {need - 2}, so it needs at least {need} "
                                      "tokens")
        template = prompt_template("0shot_cot" if self.cot else "0shot")
        result = []
        for index, item in enumerate(load_items(self.data_dir)[:limit]):
            check_item(item, f"{self.name}: item {index}")
            prompt = fill(template, item, context=item["context"])
            metadata = {key: item[key] for key in FIELDS}
            metadata["budget"] = budget
            ids = render(tokenizer, middle_truncate(tokenizer, prompt, budget))
            result.append(Sample(f"{index}", ids, self.max_new_tokens, [item["answer"]], metadata))
        return result

    def score(self, prediction: str, sample: Sample) -> float:
        """1.0 when the extracted letter of the stripped response is the answer, else 0.0."""
        return float(extract_answer(prediction.strip()) == sample.metadata["answer"])

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, float]:
        """``result.py``: overall, easy, hard (every other difficulty), short, medium, long (every other length),
        each ``round(100 · accuracy, 1)`` (NaN when empty); ``num_failed`` counts empty responses."""
        failed = sum(r["prediction"] == "" for r in records)
        if self.skip_failed:
            records = [r for r in records if r["prediction"] != ""]
        sums = dict.fromkeys(("easy", "hard", "short", "medium", "long"), 0.0)
        counts = dict.fromkeys(sums, 0)
        for record in records:
            accuracy = record["score"]
            if self.compensated and extract_answer(record["prediction"].strip()) is None:
                accuracy = 0.25
            meta = record["metadata"]
            difficulty = "easy" if meta["difficulty"] == "easy" else "hard"
            size = meta["length"] if meta["length"] in ("short", "medium") else "long"
            for key in (difficulty, size):
                sums[key] += accuracy
                counts[key] += 1

        def percent(total: float, n: int) -> float:
            return round(100 * total / n, 1) if n else float("nan")

        metrics = {"score": percent(sums["easy"] + sums["hard"], len(records))}
        metrics.update({f"score_{key}": percent(sums[key], counts[key]) for key in sums})
        metrics["num_failed"] = failed
        return metrics


@register("longbench_v2", group="longbench_v2")
class LongBenchV2Direct(LongBenchV2):
    """LongBench-v2, 0-shot direct answer (the main setting): 128 new tokens."""


@register("longbench_v2_cot")
class LongBenchV2CoT(LongBenchV2):
    """LongBench-v2 with chain of thought: 1024 tokens of reasoning (``0shot_cot``), then the answer turn
    (``0shot_cot_ans``, the document omitted) with 128 tokens."""

    cot = True

    def follow_up(self, sample: Sample, prediction: str, tokenizer) -> Sample | None:
        """The answer turn for a reasoning ``prediction``; None once answered, or when the reasoning is empty (a
        failed item, as upstream)."""
        if "cot" in sample.metadata or prediction == "":
            return None
        cot = prediction.strip()
        prompt = fill(prompt_template("0shot_cot_ans"), sample.metadata, cot=cot)
        ids = render(tokenizer, middle_truncate(tokenizer, prompt, sample.metadata["budget"]))
        return Sample(sample.id, ids, 128, sample.references, {**sample.metadata, "cot": cot})
