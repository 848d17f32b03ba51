"""LongBench's official per-answer metrics (`THUDM/LongBench` @ 2e00731, `LongBench/metrics.py`), quirks included.

Each metric maps ``(prediction, gold, all_classes)`` to a float in [0, 1]. Behaviour kept on purpose:
- code similarity is fuzzywuzzy 0.18.0's ``fuzz.ratio`` on its pure-difflib path (the official requirements do not list
  python-Levenshtein), rounded with Python's ``round``; it is computed here with difflib directly so that an installed
  python-Levenshtein cannot change the numbers;
- the classification metric removes items from the list it iterates, so some classes are skipped;
- ROUGE is the PyPI ``rouge`` package (1.0.1), any exception (empty prediction, recursion limit) scoring 0;
- ``\\d+`` matches any Unicode digit run, and Chinese normalisation removes ``》`` but not ``《``.
"""

from __future__ import annotations

import difflib
import logging
import re
import string
from collections import Counter
from collections.abc import Callable

CHINESE_PUNCTUATION = (
    "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."
)
_PUNCTUATION = set(string.punctuation)
_ZH_PUNCTUATION = set(string.punctuation + CHINESE_PUNCTUATION)


def _jieba_cut(text: str) -> list[str]:
    import jieba

    jieba.setLogLevel(logging.WARNING)
    return list(jieba.cut(text, cut_all=False))


def normalize_answer(text: str) -> str:
    """SQuAD-style normalisation: lowercase, drop ASCII punctuation, then articles, then collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def normalize_zh_answer(text: str) -> str:
    """Lowercase, drop ASCII and Chinese punctuation, remove all whitespace."""
    return "".join("".join(ch for ch in text.lower() if ch not in _ZH_PUNCTUATION).split())


def f1_tokens(prediction: list[str], gold: list[str]) -> float:
    """Multiset-overlap F1 of two token lists (0 when nothing overlaps)."""
    same = sum((Counter(prediction) & Counter(gold)).values())
    if same == 0:
        return 0
    precision = 1.0 * same / len(prediction)
    recall = 1.0 * same / len(gold)
    return (2 * precision * recall) / (precision + recall)


def qa_f1(prediction: str, gold: str, all_classes=None) -> float:
    return f1_tokens(normalize_answer(prediction).split(), normalize_answer(gold).split())


def qa_f1_zh(prediction: str, gold: str, all_classes=None) -> float:
    def tokens(text: str) -> list[str]:
        return [t for t in (normalize_zh_answer(t) for t in _jieba_cut(text)) if len(t) > 0]

    return f1_tokens(tokens(prediction), tokens(gold))


def rouge_l(prediction: str, gold: str, all_classes=None) -> float:
    """ROUGE-L F of the ``rouge`` package; 0.0 when it raises."""
    from rouge import Rouge

    try:
        return Rouge().get_scores([prediction], [gold], avg=True)["rouge-l"]["f"]
    except Exception:  # noqa: BLE001  (official: a bare except → 0.0)
        return 0.0


def rouge_l_zh(prediction: str, gold: str, all_classes=None) -> float:
    return rouge_l(" ".join(_jieba_cut(prediction)), " ".join(_jieba_cut(gold)))


def classification(prediction: str, gold: str, all_classes=None) -> float:
    """1/len(matches) if gold is among the class names found in the prediction, else 0."""
    matches = [name for name in all_classes if name in prediction]
    for name in matches:  # mutating the list being iterated skips elements: official behaviour
        if name in gold and name != gold:
            matches.remove(name)
    return 1.0 / len(matches) if gold in matches else 0.0


def _fraction_equal(prediction: str, target: str) -> float:
    numbers = re.findall(r"\d+", prediction)
    return float(0.0 if not numbers else sum(n == target for n in numbers) / len(numbers))


def count(prediction: str, gold: str, all_classes=None) -> float:
    return _fraction_equal(prediction, str(gold))


def retrieval(prediction: str, gold: str, all_classes=None) -> float:
    return _fraction_equal(prediction, re.findall(r"Paragraph (\d+)", gold)[0])


def retrieval_zh(prediction: str, gold: str, all_classes=None) -> float:
    return _fraction_equal(prediction, re.findall(r"段落(\d+)", gold)[0])


def fuzz_ratio(a: str, b: str) -> int:
    """fuzzywuzzy 0.18.0 ``fuzz.ratio`` on its difflib path: 100 if equal, 0 if either is empty, else
    ``int(round(100 · SequenceMatcher(None, a, b).ratio()))``."""
    if a == b:
        return 100
    if not a or not b:
        return 0
    return int(round(100 * difflib.SequenceMatcher(None, a, b).ratio()))


def code_sim(prediction: str, gold: str, all_classes=None) -> float:
    """Similarity of the first prediction line without a backtick, ``#`` or ``//`` to the gold line."""
    line = next((x for x in prediction.lstrip("\n").split("\n") if "`" not in x and "#" not in x and "//" not in x), "")
    return fuzz_ratio(line, gold) / 100


METRICS: dict[str, Callable[..., float]] = {
    **dict.fromkeys(
        ["narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique", "triviaqa"], qa_f1
    ),
    "multifieldqa_zh": qa_f1_zh,
    **dict.fromkeys(["gov_report", "qmsum", "multi_news", "samsum"], rouge_l),
    **dict.fromkeys(["dureader", "vcsum"], rouge_l_zh),
    **dict.fromkeys(["trec", "lsht"], classification),
    "passage_retrieval_en": retrieval,
    "passage_retrieval_zh": retrieval_zh,
    "passage_count": count,
    **dict.fromkeys(["lcc", "repobench-p"], code_sim),
}
"""The metric of each of the 21 LongBench datasets (LongBench-E datasets use their base name)."""

FIRST_LINE_DATASETS = ("trec", "triviaqa", "samsum", "lsht")
"""Datasets whose prediction is cut to its first line (after stripping leading newlines) before scoring."""
