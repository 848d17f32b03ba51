"""Official scorers on hand-made cases: every LongBench metric and quirk, RULER's string matches, LongBench-v2's answer
extraction (see reference/benchmarks.md, the scoring sections and the appendix)."""

from __future__ import annotations

import random
import sys

import pytest

from elastic_bench.tasks import longbench, longbench_metrics, longbench_v2, ruler

TREC = ["Date", "City", "Other location", "location"]

# (dataset, prediction, answers, all_classes, expected score)
CASES = [
    # qa_f1: lowercase, punctuation removed before articles, whitespace collapsed; multiset F1
    ("narrativeqa", "The Eiffel  Tower!", ["eiffel tower"], None, 1.0),
    ("qasper", "Paris France", ["Paris"], None, 2 * 0.5 * 1 / 1.5),
    ("multifieldqa_en", "the.", ["an"], None, 0.0),  # both normalise to nothing: no overlap scores 0
    ("hotpotqa", "no idea", ["Paris", "no"], None, 2 * 0.5 * 1 / 1.5),  # max over gold answers
    ("2wikimqa", "x x y", ["y y"], None, 2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2)),  # multiset overlap: one "y"
    ("musique", "", ["x"], None, 0.0),
    # triviaqa: qa_f1 after the first-line cut (only leading "\n" stripped)
    ("triviaqa", "\n\nParis\nand more words", ["Paris"], None, 1.0),
    ("triviaqa", " \nParis", ["Paris"], None, 0.0),
    # Chinese F1 on jieba tokens: 北京/是/中国/的/首都 (。 removed) against 北京
    ("multifieldqa_zh", "北京是中国的首都。", ["北京"], None, 2 * 0.2 * 1 / 1.2),
    # rouge 1.0.1: unique-word counting makes a perfect match 0.999999995; an empty prediction raises → 0
    ("gov_report", "the cat sat on the mat", ["the cat sat on the mat"], None, 0.999999995),
    ("qmsum", "", ["a summary"], None, 0.0),
    ("multi_news", "   ", ["a summary"], None, 0.0),
    ("samsum", "\nAnna will come.\nBob agrees.", ["Anna will come."], None, 0.999999995),  # first line only
    ("dureader", "北京是中国的首都", ["北京是中国的首都"], None, 0.999999995),
    ("vcsum", "会议讨论了预算", ["预算"], None, None),  # checked against the rouge package below
    # classification: classes found in the prediction; substrings of gold other than gold are removed while iterating
    ("trec", "City or Date", ["City"], TREC, 0.5),
    ("trec", "Other location", ["Other location"], TREC, 1.0),  # "location" ⊂ gold is removed
    ("trec", "Date\nCity", ["Date"], TREC, 1.0),  # first line only
    ("lsht", "martial art", ["martial art"], ["art", "mart", "martial art"], 0.5),  # "mart" skipped by the removal
    ("lsht", "体育", ["财经"], ["体育", "财经"], 0.0),
    # retrieval and count: every digit run of the prediction votes
    ("passage_retrieval_en", "Paragraph 12, or maybe 3", ["Paragraph 12"], None, 0.5),
    ("passage_retrieval_en", "Paragraph １２", ["Paragraph 12"], None, 0.0),  # full-width digits never equal ASCII
    ("passage_retrieval_zh", "段落5", ["段落5"], None, 1.0),
    ("passage_count", "There are 7 unique paragraphs, not 8", [7], None, 0.5),
    ("passage_count", "seven", [7], None, 0.0),
    # code similarity: the first line without a backtick, "#" or "//"; whitespace-only lines count
    ("lcc", "```python\n# comment\nx = foo(1)\n", ["x = foo(1)"], None, 1.0),
    ("lcc", 'color = "#fff"\nx = 1', ["x = 1"], None, 1.0),
    ("repobench-p", "\n   \nx = foo(1)", ["x = foo(1)"], None, 0.31),  # "   " is the line scored: 2·2/13
    ("repobench-p", "", [""], None, 1.0),
    ("repobench-p", "# only comments", ["x"], None, 0.0),
]


@pytest.mark.parametrize("dataset, prediction, answers, classes, expected", CASES)
def test_longbench_score_hand_made(dataset, prediction, answers, classes, expected):
    got = longbench.score(dataset, prediction, answers, classes)
    if expected is None:
        import jieba
        from rouge import Rouge

        cut = " ".join(jieba.cut(prediction, cut_all=False)), " ".join(jieba.cut(answers[0], cut_all=False))
        expected = Rouge().get_scores([cut[0]], [cut[1]], avg=True)["rouge-l"]["f"]
        assert 0 < expected < 1
    assert got == pytest.approx(expected, abs=1e-12)


def test_every_dataset_has_a_case():
    assert {case[0] for case in CASES} == set(longbench.DATASETS)
    assert len(longbench.DATASETS) == 21


def test_chinese_normalisation_removes_closing_but_not_opening_title_mark():
    assert longbench_metrics.normalize_zh_answer("《书名》 A b") == "《书名ab"


def test_rouge_exception_scores_zero(monkeypatch):
    """A single long "sentence" exhausts the recursion limit inside rouge; the official bare except scores 0."""
    text = " ".join(f"w{i}" for i in range(400))
    assert longbench_metrics.rouge_l(text, text) > 0.99
    limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(300)
        assert longbench_metrics.rouge_l(text, text) == 0.0
    finally:
        sys.setrecursionlimit(limit)


def test_fuzz_ratio_matches_fuzzywuzzy_difflib_path():
    """Our ratio is fuzzywuzzy 0.18.0's on its difflib path, including difflib's autojunk (strings of 200+ chars)."""
    with pytest.warns(UserWarning, match="pure-python SequenceMatcher"):
        from fuzzywuzzy import fuzz
    import difflib

    assert fuzz.SequenceMatcher is difflib.SequenceMatcher
    rng = random.Random(0)
    for _ in range(300):
        n, m = rng.choice([(0, 5), (5, 5), (20, 30), (210, 250), (300, 180)])
        a = "".join(rng.choice("ab (x)=_;\n") for _ in range(rng.randint(0, n + 5)))
        b = "".join(rng.choice("ab (x)=_;\n") for _ in range(rng.randint(0, m + 5)))
        assert longbench_metrics.fuzz_ratio(a, b) == fuzz.ratio(a, b)


def test_fuzz_ratio_rounds_half_to_even_on_the_float_product():
    # 100 · 2·23/80 = 57.49999… in floating point → 57 (and not 58)
    assert 100 * (2 * 23 / 80) < 57.5
    a, b = "a" * 23 + "b" * 17, "a" * 23 + "c" * 17
    assert longbench_metrics.fuzz_ratio(a, b) == 57


def test_unknown_dataset_is_rejected():
    with pytest.raises(ValueError, match="unknown LongBench dataset 'hotpot'"):
        longbench.score("hotpot", "x", ["x"], None)


# ---- RULER -----------------------------------------------------------------------------------------------------


def test_ruler_string_match_all_and_part():
    refs = ["1234567", "Apple-Pie", "9999999"]
    pred = "  The values are 1234567 and apple-pie.  "
    assert ruler.score("all", pred, refs) == pytest.approx(2 / 3)
    assert ruler.score("part", pred, refs) == 1.0
    assert ruler.score("part", "nothing", refs) == 0.0
    with pytest.raises(ValueError, match="unknown RULER metric"):
        ruler.score("any", pred, refs)


def test_ruler_post_processing_maps_control_characters_to_newlines():
    assert ruler.score("all", "\x00abc\tdef\x01", ["abc\ndef"]) == 1.0
    assert ruler.score("all", "abc\tdef", ["abc\tdef"]) == 0.0  # a reference with a tab never matches


def test_ruler_aggregate_is_sum_over_n_times_100_rounded():
    task = ruler.GENERATORS["niah"]()
    records = [{"score": s} for s in (1.0, 0.0, 0.5, 1 / 3)]
    assert task.aggregate(records) == {"score": round((1.0 + 0.0 + 0.5 + 1 / 3) / 4 * 100, 2)} == {"score": 45.83}


# ---- LongBench-v2 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response, expected",
    [
        ("The correct answer is (B)", "B"),
        ("**The correct answer is (C)**", "C"),
        ("The correct answer is B.", "B"),
        ("The correct answer is B, but The correct answer is (C)", "C"),  # the parenthesised form wins anywhere
        ("The correct answer is Definitely B", "D"),  # the bare form takes the first letter after "is "
        ("the correct answer is (B)", None),  # case-sensitive
        ("The correct answer is  (B)", None),  # exactly one space
        ("The correct answer is (E)", None),
        ("I think B", None),
    ],
)
def test_longbench_v2_extract_answer(response, expected):
    assert longbench_v2.extract_answer(response) == expected
