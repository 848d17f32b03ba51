"""Scorer agreement for the benchmarks of 2026: each upstream rule written again here from its upstream description
(BABILong's `compare_answers`, NoLiMa's ``contains``, MRCR's and GraphWalks' dataset cards, HELMET's `utils.py`
post-processing, LongBench Pro's `modules/utils.py`), compared with the task's scorer on ≥ 200 generated
prediction/answer pairs per benchmark, plus the cases that pin each quirk."""

from __future__ import annotations

import difflib
import math
import random
import re
import string
from itertools import combinations

import pytest

from elastic_bench.tasks import babilong, graphwalks, longbench_pro, mrcr, nolima
from elastic_bench.tasks.base import Sample
from elastic_bench.tasks.helmet import datasets as helmet
from elastic_bench.tasks.helmet import metrics as helmet_metrics
from elastic_bench.tasks.ranking import ndcg

PAIRS = 300
WORDS = ["kitchen", "garden", "office", "apple", "milk", "Mary", "Fred", "yes", "no", "the", "a", "an", "Room 5",
         "one", "two", "bedroom", "hallway", "bathroom", "football", "Bill", "Jeff", "nothing", "e,s", "n,w"]


def _text(rng: random.Random, pool=WORDS, extra: str = ".,!?<>\n:[] ") -> str:
    return "".join(rng.choice(pool) + rng.choice(extra) for _ in range(rng.randint(0, 6)))


# ---- BABILong ------------------------------------------------------------------------------------------------------


def upstream_babilong(target: str, output: str, question: str, labels: list[str]) -> bool:
    out = output.lower()
    if "." in out:
        out = out[: out.index(".")]
    for marker in ("<context>", "<example>"):
        if marker in out:
            out = out[: out.index(marker)]
    question, target = question.lower(), target.lower()
    lowered = {label.lower() for label in labels}
    found = sorted(label for label in lowered if label in out and label not in question)
    if "," in target and len(target) > 3:
        wanted = target.split(",")
        return len(found) == len(wanted) and set(wanted) <= set(found)
    return found == [target]


def test_babilong_agrees_with_compare_answers():
    rng = random.Random(1)
    labels = babilong.protocol()["labels"]
    for _ in range(PAIRS):
        task = rng.choice(sorted(labels))
        target = ",".join(rng.sample(labels[task], 2)) if task == "qa8" and rng.random() < 0.5 else rng.choice(
            labels[task])
        output = _text(rng, labels[task] + WORDS) + rng.choice(["", target, target.upper(), "The " + target + "."])
        question = "Where is " + rng.choice(labels[task] + ["Mary", "it"]) + "?"
        assert babilong.is_correct(target, output, question, labels[task]) == upstream_babilong(
            target, output, question, labels[task]), (target, output, question)


@pytest.mark.parametrize("target, output, question, expected", [
    ("kitchen", "The most recent location of Mary is kitchen.", "Where is Mary?", True),
    ("kitchen", "kitchen. Before that, garden", "Where is Mary?", True),  # only the first sentence counts
    ("kitchen", "kitchen or garden", "Where is Mary?", False),  # two labels named
    ("kitchen", "Before the garden it was in the kitchen", "Where was it before the garden?", True),  # asked labels
    ("apple,milk", "milk and apple", "What is Mary carrying?", True),  # qa8: all items, nothing else
    ("apple,milk", "milk", "What is Mary carrying?", False),
    ("kitchen", "Question: kitchen", "Where is Mary?", True),  # the "Question" cut never fires on lower-cased text
])
def test_babilong_quirks(target, output, question, expected):
    labels = ["kitchen", "garden", "apple", "milk", "football"]
    assert babilong.is_correct(target, output, question, labels) is expected


# ---- NoLiMa ---------------------------------------------------------------------------------------------------------


def test_nolima_contains_agrees():
    rng = random.Random(2)
    for _ in range(PAIRS):
        gold = rng.sample(["Yuki", "Stuart", "Diana", "green", "Green"], rng.randint(1, 2))
        response = _text(rng, WORDS + ["Yuki", "stuart", "Dian", "green"])
        expected = 1.0 if [g for g in gold if response.find(g) >= 0] else 0.0
        assert nolima.contains(response, gold) == expected


# ---- MRCR -----------------------------------------------------------------------------------------------------------


def upstream_mrcr(response: str, answer: str, prefix: str) -> float:
    if response[: len(prefix)] != prefix:
        return 0.0
    body = answer[len(prefix):] if answer[: len(prefix)] == prefix else answer
    return difflib.SequenceMatcher(None, response[len(prefix):], body).ratio()


def test_mrcr_agrees_with_the_cards_grade():
    rng = random.Random(3)
    for _ in range(PAIRS):
        prefix = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(10))
        answer = prefix + _text(rng)
        response = rng.choice([answer, prefix + _text(rng), _text(rng), " " + answer, answer[: rng.randint(0, 20)],
                               prefix, prefix + answer[len(prefix):][::-1]])
        if rng.random() < 0.1:
            answer = answer[len(prefix):]  # an answer without the prefix keeps its text
        assert mrcr.grade(response, answer, prefix) == pytest.approx(upstream_mrcr(response, answer, prefix), abs=0)


def test_mrcr_prefix_is_required_at_the_very_start():
    assert mrcr.grade("abc123 A poem.", "abc123A poem.", "abc123") < 1.0
    assert mrcr.grade(" abc123A poem.", "abc123A poem.", "abc123") == 0.0
    assert mrcr.grade("abc123A poem.", "abc123A poem.", "abc123") == 1.0


# ---- GraphWalks -----------------------------------------------------------------------------------------------------


def card_nodes(response: str) -> list[str] | None:
    """The card's ``get_list`` with its prefix slip mended: the last line's ``Final Answer: [...]`` contents."""
    last = response.split("\n")[-1]
    if "Final Answer:" not in last:
        return None
    start = last.find("Final Answer:")
    rest = last[start + len("Final Answer:"):]
    rest = rest[1:] if rest.startswith(" ") else rest
    if not rest.startswith("[") or "]" not in rest:
        return None
    inner = rest[1: rest.rindex("]") + 1].rstrip("]")
    return [part.strip() for part in inner.split(",") if part.strip()]


def card_f1(response: str, truth: list[str]) -> float:
    nodes = card_nodes(response)
    if nodes is None:
        return 0.0
    hit = len(set(nodes) & set(truth))
    if hit == 0:
        return 0.0
    recall, precision = hit / len(set(truth)), hit / len(set(nodes))
    return 2 * recall * precision / (recall + precision)


def test_graphwalks_agrees_with_the_card():
    rng = random.Random(4)
    nodes = [f"{i:04x}" for i in range(12)]
    for _ in range(PAIRS):
        truth = rng.sample(nodes, rng.randint(1, 5))
        guess = rng.sample(nodes, rng.randint(0, 5))
        listed = ", ".join(guess)
        response = rng.choice([f"Final Answer: [{listed}]", f"Final Answer:[{listed}]", f"reason\nFinal Answer: "
                               f"[{listed}]", f"Final Answer: [{listed}]\n", f"Final Answer:  [{listed}]",
                               f"Final Answer: {listed}", f"final answer: [{listed}]", f"x Final Answer: [{listed}]]",
                               f"Final Answer: [{listed}] done", listed])
        assert graphwalks.score(response, truth) == pytest.approx(card_f1(response, truth), abs=1e-12), response


def test_graphwalks_corrections_of_the_card_code():
    """The card's literal code gives 2/3 here (its first node keeps "Final Answer: [") and 1.0 for a wrong list."""
    assert graphwalks.score("Final Answer: [ab12, cd34, ef56]", ["ab12", "cd34", "ef56"]) == 1.0
    assert graphwalks.score("Final Answer: [zz99]", ["ab12"]) == 0.0
    assert graphwalks.score("Final Answer: []", ["ab12"]) == 0.0
    assert graphwalks.score("Final Answer: [ab12]\n", ["ab12"]) == 0.0  # the last line is empty


# ---- HELMET ---------------------------------------------------------------------------------------------------------


def upstream_normalize(text: str) -> str:
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def upstream_parse(output: str, prefix: str = "Answer:") -> str:
    hit = re.search(f"(?:{prefix})(.*)(?:\n|$)", output, flags=re.IGNORECASE)
    line = hit.group(1) if hit else output.split("\n")[0]
    line = line.strip()
    if line.lower().startswith(prefix.lower()):
        line = line[len(prefix):]
    return line.strip()


def upstream_sub_em(prediction: str, answers: list[str]) -> float:
    def one(text):
        return max(float(upstream_normalize(a) in upstream_normalize(text)) for a in answers)

    return max(one(prediction), one(upstream_parse(prediction)))


def upstream_rankings(output: str) -> dict[str, int]:
    cleaned = output.replace("[", "").replace("]", "").replace(":", "").lower().replace("id", "")
    runs = [m.group(0) for m in re.finditer(r"\d+(?:\s*>\s*\d+)*", cleaned)]
    best = max(runs, key=len) if runs else ""
    order = [x.strip() for x in best.split(">") if x.strip().isdigit()] if best else [cleaned]
    result = {}
    for i, doc in enumerate(order):
        if doc not in result:
            result[doc] = len(order) - i
    return result


def upstream_ndcg(run: dict[str, float], qrel: dict[str, float], k: int) -> float:
    order = sorted(run.items(), key=lambda item: (-item[1], [-ord(c) for c in item[0]]))
    gains = [qrel.get(doc, 0) for doc, _ in order][:k]
    dcg = sum(g / math.log2(rank + 1) for rank, g in enumerate(gains, 1) if g > 0)
    best = sorted([g for g in qrel.values() if g > 0], reverse=True)[:k]
    idcg = sum(g / math.log2(rank + 1) for rank, g in enumerate(best, 1))
    return 0.0 if idcg == 0 else dcg / idcg


def test_helmet_substring_em_and_parsing_agree():
    rng = random.Random(5)
    for _ in range(PAIRS):
        answers = rng.sample(["Paris", "the Louvre", "1,000", "New-York", "an apple"], rng.randint(1, 2))
        prediction = rng.choice(["Answer:", "answer: ", "", "Corresponding value:"]) + _text(
            rng, WORDS + ["Paris", "louvre", "1000", "New York", "apple"])
        assert helmet_metrics.best_of_parsed(helmet_metrics.substring_exact_match, prediction, answers) == \
            upstream_sub_em(prediction, answers), prediction
        assert helmet_metrics.parse_output(prediction) == upstream_parse(prediction)


def test_helmet_rerank_ndcg_agrees():
    rng = random.Random(6)
    ids = [str(i) for i in range(20)]
    for _ in range(PAIRS):
        qrel = {i: rng.choice([0, 0, 1, 2, 3]) for i in rng.sample(ids, 14)}
        ranking = rng.sample(ids, rng.randint(0, 16))
        output = "Ranking:" + rng.choice([" > ", ">", " ID: > "]).join(
            rng.choice(["[{}]", "ID{}", "{}"]).format(i) for i in ranking) + rng.choice(["", "\n3 > 4", " text"])
        parsed = helmet_metrics.parse_rankings(output)
        assert parsed == upstream_rankings(output), output
        assert ndcg(parsed, qrel, 10) == pytest.approx(upstream_ndcg(parsed, qrel, 10), abs=1e-12)
        task = helmet.MsMarco()
        sample = Sample("0", [], 200, [], {"qrel": qrel})
        assert task.metric(output, sample) == round(upstream_ndcg(parsed, qrel, 10), 5)


def test_helmet_icl_ruler_and_choice_agree():
    rng = random.Random(7)
    icl, ruler, choice = helmet.Icl(), helmet.RulerNiah(), helmet.InfBenchChoice()
    for _ in range(PAIRS):
        label = str(rng.randrange(12))
        output = "label:" + rng.choice([f" {label}", f" {label}\nlabel: 3", f"{label}.", " label: " + label,
                                        f" {rng.randrange(12)}", ""])
        expected = float(upstream_normalize(upstream_parse(output, "label:")) == upstream_normalize(label))
        assert icl.metric(output, Sample("0", [], 20, [label])) == expected
        values = [str(rng.randint(10, 99)) for _ in range(rng.randint(1, 4))]
        spoken = rng.sample(values + ["11", "12"], rng.randint(0, len(values) + 2))
        said = "The special magic numbers are " + " ".join(spoken)
        assert ruler.metric(said, Sample("0", [], 50, values)) == sum(v in said for v in values) / len(values)
        letter = rng.choice("ABCD")
        refs = [letter, f"{letter}. the {rng.choice(WORDS)}"]
        said = rng.choice([letter, f"Answer: {letter}", refs[1].upper() + " is right", "E", f"({letter})"])
        exact = max(float(upstream_normalize(s) in {upstream_normalize(r) for r in refs})
                    for s in (said, upstream_parse(said)))
        assert choice.metric(said, Sample("0", [], 10, refs)) == (1.0 if refs[1].lower() in said.lower() else exact)


# ---- LongBench Pro --------------------------------------------------------------------------------------------------


def upstream_lines(prediction: str) -> list[str]:
    for marker in ("[Answer]", "[答案]"):
        if marker in prediction:
            prediction = prediction.split(marker)[-1]
            break
    return [re.sub(r"\s+", " ", line.strip()) for line in prediction.strip().lower().split("\n")]


def upstream_longbench_pro(metric: str, answers: list[str], prediction: str) -> float:
    if not prediction:
        return 0.0
    gold = [re.sub(r"\s+", " ", a.lower().strip()) for a in answers]
    lines = upstream_lines(prediction)
    if metric == "Accuracy":
        return float(gold[0] == lines[0])
    if metric == "SubEM":
        return sum(1 for a in gold if a in lines) / len(gold)
    if metric == "F1_Score":
        common = set(gold) & set(lines)
        if not common:
            return 0.0
        p, r = len(common) / len(set(lines)), len(common) / len(set(gold))
        return 2 * p * r / (p + r)
    if metric == "Pairwise_Accuracy":
        if len(gold) < 2 or len(lines) < 2:
            return 0.0
        last = {}
        for i, line in enumerate(lines):
            last[line] = i
        good = sum(1 for a, b in combinations(gold, 2) if a in last and b in last and last[a] < last[b])
        return good / (len(lines) * (len(lines) - 1) / 2)
    run = {}
    for i, line in enumerate(lines):
        run[line] = len(lines) - i
    return upstream_ndcg(run, {a: len(gold) - i for i, a in enumerate(gold)}, len(gold))


METRICS = {"T1.1 Global Cohesive Retrieval": "NDCG", "T2.2 Local Causal Chain Sorting": "Pairwise_Accuracy",
           "T3.1 Multi-Doc Integration QA": "Accuracy", "T5.1 Full-Sentence Citation Alignment": "F1_Score",
           "T8.2 Single-Source Targeted Aggregation": "SubEM"}


def test_longbench_pro_agrees():
    rng = random.Random(8)
    items = ["alpha", "beta", "gamma", "delta", "Doc 1", "doc 2", "[1]", "事件"]
    for _ in range(PAIRS):
        task = rng.choice(sorted(METRICS))
        answers = rng.sample(items, rng.randint(1, 4))
        lines = [rng.choice(items + [a.upper() for a in answers] + ["  beta  ", ""]) for _ in range(rng.randint(0, 5))]
        prediction = rng.choice(["", "thinking...\n[Answer]\n", "[答案]", "[answer]"]) + "\n".join(lines)
        prediction = prediction.strip()
        got = longbench_pro.score(task, answers, prediction)
        assert got == pytest.approx(upstream_longbench_pro(METRICS[task], answers, prediction), abs=1e-12), (
            task, answers, prediction)
        assert 0.0 <= got <= 1.0


def test_longbench_pro_metric_table_is_upstreams_without_summaries():
    assert len(longbench_pro.METRIC_OF_TASK) == 23
    assert not any(t.startswith("T4") for t in longbench_pro.METRIC_OF_TASK)
