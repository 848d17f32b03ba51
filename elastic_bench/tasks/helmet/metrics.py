"""HELMET's scorers (princeton-nlp/HELMET @ 4526dfb, MIT, `utils.py` and the post-processing of `data.py`).

- Answers are normalised SQuAD-style (`elastic_bench.tasks.longbench_metrics.normalize_answer`, the same function);
  a metric over several gold answers takes the best (a list of lists is flattened).
- ``substring_exact_match``: the normalised gold is a substring of the normalised prediction.
- `parse_output`: the text after the first ``prefix`` (case-insensitive) up to the line's end, else the first line;
  stripped, a repeated prefix removed. Post-processing scores a prediction and its parsed form and keeps the best.
- `parse_rankings`: the longest ``ID > ID > …`` run of a re-ranking answer, each ID ranked by its first position.
- Re-ranking is scored by NDCG@10 (`elastic_bench.tasks.ranking.ndcg`), rounded to 5 decimals per query as
  HELMET's ``calculate_retrieval_metrics`` rounds its means.
"""

from __future__ import annotations

import re

from ..longbench_metrics import normalize_answer


def _golds(answers) -> list[str]:
    if isinstance(answers, str):
        return [answers]
    if answers and isinstance(answers[0], list):
        return [a for group in answers for a in group]
    return list(answers)


def substring_exact_match(prediction: str, answers) -> float:
    """1.0 if a normalised gold answer is contained in the normalised prediction."""
    text = normalize_answer(prediction)
    return float(any(normalize_answer(a) in text for a in _golds(answers)))


def exact_match(prediction: str, answers) -> float:
    """1.0 if the normalised prediction equals a normalised gold answer."""
    text = normalize_answer(prediction)
    return float(any(normalize_answer(a) == text for a in _golds(answers)))


def parse_output(output: str, prefix: str = "Answer:") -> str:
    """HELMET's ``parse_output`` (its second pattern always matches, so a string always comes back)."""
    for pattern in (f"(?:{prefix})(.*)(?:\n|$)", r"(?:^)(.*)(?:\n|$)"):
        match = re.search(pattern, output, flags=re.IGNORECASE)
        if match is not None:
            return re.sub(f"^{re.escape(prefix)}", "", match[1].strip(), flags=re.IGNORECASE).strip()
    return ""


def best_of_parsed(metric, prediction: str, answers, prefix: str = "Answer:") -> float:
    """``default_post_process``: the metric of the prediction or of its parsed form, whichever is higher."""
    return max(metric(prediction, answers), metric(parse_output(prediction, prefix), answers))


def parse_rankings(output: str) -> dict[str, int]:
    """HELMET's ``parse_rankings``: ``{id: score}``, the first-ranked ID scoring highest (the whole cleaned output
    stands for one ID when no number is found)."""
    output = re.sub(r"[\[\]:]", "", output).lower().replace("id", "")
    longest = ""
    for match in re.finditer(r"(\d+)(?:\s*>\s*(\d+))*", output):
        if len(match.group(0)) > len(longest):
            longest = match.group(0)
    ranking = [n.strip() for n in longest.split(">") if n.strip().isdigit()] if longest else [output]
    scores: dict[str, int] = {}
    for i, doc in enumerate(ranking):
        scores.setdefault(doc, len(ranking) - i)
    return scores
