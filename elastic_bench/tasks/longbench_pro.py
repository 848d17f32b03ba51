"""LongBench Pro (caskcsg/longcontext @ 88fbeb8, `LongBench-Pro/`; data `caskcsg/LongBench-Pro`, Apache-2.0): 1,500
bilingual samples over 11 primary and 25 secondary tasks, labelled 8k … 256k tokens (Qwen tokenizer).

Protocol (`modules/inference.py`, `model_manager.py`, `evaluation.py`, `utils.py`), non-thinking: the prompt is
``f"{context}\\n\\n\\n\\n{question_nonthinking}"``, stripped, truncated in the middle when too long (the LongBench-v2
rule, `elastic_bench.tasks.longbench_v2.middle_truncate`) and sent as one user turn through the chat template; 1,024
new tokens. The stripped prediction is scored by its secondary task's metric (an empty one scores 0): after keeping
what follows the last ``[Answer]`` / ``[答案]``, lower-casing, splitting into lines and collapsing spaces —
``Accuracy`` (first line equals the first answer), ``F1_Score`` (sets of lines), ``SubEM`` (fraction of answers among
the lines), ``NDCG`` (trec_eval ``ndcg_cut`` at the number of answers, answers graded by position) or
``Pairwise_Accuracy`` (ordered answer pairs over all line pairs). The score is the mean in percent, with the
breakdowns upstream reports (language, contextual requirement, difficulty).

Not reproduced: the two summary tasks (T4.1, T4.2), whose score half rests on Qwen3-Embedding-8B similarities, are
left out; upstream samples at temperature 1.0 and averages three runs (best-of-3 aside), this runs once, greedy.

Lengths: a run at length L holds the samples labelled with the longest of 8k … 256k (8192 … 262144 tokens) not above
L, each truncated so that it fits L with the answer budget.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations
from typing import Any

from .base import LengthTooShortError, Sample, Task, register, render
from .corpora import Source, fetch
from .longbench_v2 import middle_truncate
from .ranking import ndcg
from .records import fields, read_records

REPO = "caskcsg/LongBench-Pro"
LABELS = ("8k", "16k", "32k", "64k", "128k", "256k")
MAX_NEW_TOKENS = 1024
BREAKDOWNS = {"language": ("English", "Chinese"), "contextual_requirement": ("Full", "Partial"),
              "difficulty": ("Easy", "Moderate", "Hard", "Extreme")}


def answer_lines(prediction: str) -> list[str]:
    """``normalize_prediction``: the text after the last ``[Answer]`` (else ``[答案]``) if any, stripped,
    lower-cased, split on newlines, each line stripped with its spaces collapsed (empty lines kept)."""
    for marker in ("[Answer]", "[答案]"):
        if marker in prediction:
            prediction = prediction[prediction.rfind(marker) + len(marker) :]
            break
    return [" ".join(line.split()) for line in prediction.strip().lower().split("\n")]


def normalize_answers(answers: list[str]) -> list[str]:
    return [" ".join(a.lower().strip().split()) for a in answers]


def accuracy(answers: list[str], lines: list[str]) -> float:
    return float(bool(answers) and bool(lines) and answers[0] == lines[0])


def f1_score(answers: list[str], lines: list[str]) -> float:
    truth, predicted = set(answers), set(lines)
    common = len(truth & predicted)
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(truth)
    return 2 * precision * recall / (precision + recall)


def sub_em(answers: list[str], lines: list[str]) -> float:
    return sum(a in lines for a in answers) / len(answers) if answers and lines else 0.0


def ranked(answers: list[str], lines: list[str]) -> float:
    """``NDCG``: answers graded ``n, n−1, …`` by position, lines scored likewise (a repeated line keeps its last
    score), NDCG at the number of answers."""
    if not answers or not lines:
        return 0.0
    relevance = {a: len(answers) - i for i, a in enumerate(answers)}
    scores = {line: len(lines) - i for i, line in enumerate(lines)}
    return ndcg(scores, relevance, len(answers))


def pairwise_accuracy(answers: list[str], lines: list[str]) -> float:
    """``Pairwise_Accuracy``: answer pairs whose order the lines keep (a repeated line counts at its last position),
    over all pairs of lines."""
    if len(answers) < 2 or len(lines) < 2:
        return 0.0
    position = {line: i for i, line in enumerate(lines)}
    kept = sum(a in position and b in position and position[a] < position[b] for a, b in combinations(answers, 2))
    return kept / (len(lines) * (len(lines) - 1) // 2)


METRIC_OF_TASK: dict[str, Callable[[list[str], list[str]], float]] = {
    "T1.1 Global Cohesive Retrieval": ranked,
    "T1.2 Key-Snippet Retrieval": ranked,
    "T2.1 Global Timeline Reconstruction": pairwise_accuracy,
    "T2.2 Local Causal Chain Sorting": pairwise_accuracy,
    "T3.1 Multi-Doc Integration QA": accuracy,
    "T3.2 Single-Hop Fact QA": accuracy,
    "T5.1 Full-Sentence Citation Alignment": f1_score,
    "T5.2 Key-Statement Citation Alignment": f1_score,
    "T6.1 Large-Scale Document Clustering": sub_em,
    "T6.2 Targeted Subset Cluster Identification": f1_score,
    "T6.3 Global Frequency Analysis": pairwise_accuracy,
    "T7.1 Global Conflict & Inconsistency Localization": f1_score,
    "T7.2 Targeted Rule or Condition Violation Detection": f1_score,
    "T7.3 Comprehensive Error & Anomaly Sweep": f1_score,
    "T8.1 Structured Multi-Source Consistency Verification": sub_em,
    "T8.2 Single-Source Targeted Aggregation": sub_em,
    "T8.3 Long-Context Procedural State Tracking": sub_em,
    "T9.1 Dependency-Aware Multi-Version Impact Analysis": f1_score,
    "T9.2 Localized Interface Change Detection": f1_score,
    "T10.1 Large-Scale In-Context Rule Induction": sub_em,
    "T10.2 Targeted Example-Based Rule Induction": sub_em,
    "T11.1 Long-Range Entity & Commitment Tracking": accuracy,
    "T11.2 Short-Range Reference Resolution & State Query": accuracy,
}
"""The metric of each secondary task (``task_metric_config``), the two summary tasks left out."""


def score(secondary_task: str, answers: list[str], prediction: str) -> float:
    """LongBench Pro's score of one (stripped) prediction in [0, 1]; 0 for an empty one."""
    if prediction == "":
        return 0.0
    return METRIC_OF_TASK[secondary_task](normalize_answers(answers), answer_lines(prediction))


def label_for(length: int) -> str:
    fitting = [label for label in LABELS if int(label[:-1]) * 1024 <= length]
    if not fitting:
        raise LengthTooShortError(f"longbench_pro: a target length of {length} tokens is too short: its shortest "
                                  "samples are labelled 8k (8192 tokens)")
    return fitting[-1]


DATA = Source("LongBench Pro samples", ("longbench_pro/longbench_pro.json",),
              f"It is longbench_pro.json of the {REPO} dataset on the Hugging Face hub.",
              hub=(REPO, "longbench_pro.json"))


@register("longbench_pro", group="longbench_pro")
class LongBenchPro(Task):
    """LongBench Pro, non-thinking prompts, the 23 secondary tasks scored without a model."""

    sources = (DATA,)
    identities = frozenset({"dataset:longbench_pro"})

    def samples(self, tokenizer, length: int, limit: int | None = None, seed: int = 42) -> list[Sample]:
        """The samples of the length's label in file order (the first ``limit``); the seed is unused."""
        label = label_for(length)
        budget = length - MAX_NEW_TOKENS - len(render(tokenizer, ""))
        result = []
        for index, record in enumerate(read_records(fetch(DATA, self.data_dir))):
            if limit is not None and len(result) >= limit:
                break
            context, question, answers, task, primary, size = fields(
                record, ("context", "question_nonthinking", "answer", "secondary_task", "primary_task",
                         "token_length"), self.name, index)
            if size != label or task not in METRIC_OF_TASK:
                continue
            prompt = middle_truncate(tokenizer, f"{context}\n\n\n\n{question}".strip(), budget)
            metadata: dict[str, Any] = {k: record.get(k) for k in ("id", *BREAKDOWNS)}
            metadata.update(secondary_task=task, category="robust" if primary.startswith("T10") else "sensitive")
            result.append(Sample(str(record.get("id", index)), render(tokenizer, prompt), MAX_NEW_TOKENS,
                                 list(answers), metadata))
        return result

    def score(self, prediction: str, sample: Sample) -> float:
        return score(sample.metadata["secondary_task"], sample.references, prediction.strip())

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, float]:
        """The mean in percent (2 decimals), and per language, contextual requirement and difficulty
        (``score_<value>``, lower-cased; NaN for a value with no sample)."""
        metrics = super().aggregate(records)
        for key, values in BREAKDOWNS.items():
            for value in values:
                scores = [r["score"] for r in records if r["metadata"].get(key) == value]
                metrics[f"score_{value.lower()}"] = round(100 * sum(scores) / len(scores), 2) if scores else float(
                    "nan")
        return metrics
