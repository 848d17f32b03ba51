"""RULER v2 on generated fixtures (MMLU parquet rows, HotpotQA JSON with supporting facts): the 12 tasks of
NeMo-Skills' `dataset/ruler2/prepare.py` with their metrics, length fitting, the prompts of its three generators,
upstream's answers, and the scorers against upstream's rules re-implemented here (``eval_ruler2``, `mcq.py`)."""

from __future__ import annotations

import json
import math
import random
import re

import pytest
from fixtures.benchmarks_data import build, hotpotqa_item

from elastic_bench import tasks
from elastic_bench.modeling.loading import bpe_tokenizer
from elastic_bench.tasks import corpora, ruler2, ruler_data

UPSTREAM_TASKS = [f"{family}_{level}" for family in ("mk_niah", "mv_niah", "qa")
                  for level in ("basic", "easy", "medium", "hard")]
SHORTEST = 3072  # the shortest length every task fits with the fixture and this tokenizer, its budget included


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(build(tmp_path_factory.mktemp("ruler2")))


@pytest.fixture(scope="module")
def tok():
    return bpe_tokenizer()


@pytest.fixture(autouse=True)
def no_hub(offline_hub):
    """Every test here reads the fixtures only."""


def upstream_metric(task: str) -> str:
    """`prepare_task_for_ns`'s evaluator choice for a task (``choice``: the multichoice evaluator)."""
    if task in ("mk_niah_medium", "mk_niah_hard"):
        return "choice"
    if task == "mv_niah_medium":
        return "2steps"
    return "part" if "qa" in task else "all"


def user_text(tok, sample) -> str:
    text = tok.decode(sample.input_ids)
    head, tail = "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"
    assert text.startswith(head) and text.endswith(tail)  # one user turn, no system message, no answer prefix
    return text[len(head):-len(tail)]


def test_registration_metrics_budgets_and_identities():
    assert tasks.groups()["ruler2"] == [f"ruler2_{t}" for t in UPSTREAM_TASKS]
    for task in UPSTREAM_TASKS:
        cls = tasks.REGISTRY.get(f"ruler2_{task}")
        assert cls.metric == upstream_metric(task) and cls.category == "sensitive", task
        assert cls.max_new_tokens == (2048 if task in ("mv_niah_easy", "mv_niah_medium") else 1024 if task in (
            "mk_niah_easy", "mk_niah_medium", "mv_niah_hard", "qa_medium") else 128), task
        expected = {"mk_niah": {"generator:ruler2.mmlu", "dataset:mmlu"}, "mv_niah": {"generator:ruler2.mmlu",
                    "dataset:mmlu"}, "qa": {"generator:ruler2.qa", "dataset:hotpotqa"}}[task.rsplit("_", 1)[0]]
        # the basic niah tasks are RULER v1's niah generator: a router trained on it is in-distribution for them
        assert cls.identities == ({"generator:ruler.niah"} if task.endswith("niah_basic") else expected), task
    from elastic_bench.tasks import catalog

    assert catalog.benchmark_of("ruler2_qa_hard").name == "RULER v2" and catalog.benchmark_of("ruler_vt").name == (
        "RULER")


@pytest.mark.parametrize("task", UPSTREAM_TASKS)
def test_every_task_fits_its_length_and_its_own_answer_scores_full(task, data_dir, tok):
    instance = tasks.get(f"ruler2_{task}", data_dir=data_dir)
    samples = instance.samples(tok, SHORTEST, limit=2)
    assert [s.id for s in samples] == ["0", "1"]
    for sample in samples:
        assert len(sample.input_ids) + sample.max_new_tokens <= SHORTEST
        assert sample.metadata["category"] == "sensitive" and sample.references
        if instance.metric == "choice":
            assert instance.score(f"Question 1: ...\nSolution: \\boxed{{{sample.references[0]}}}", sample) == 1.0
        else:
            assert instance.score("\n".join(sample.references), sample) == 1.0
        assert instance.score("", sample) == 0.0
    again = tasks.get(f"ruler2_{task}", data_dir=data_dir).samples(tok, SHORTEST, limit=2)
    assert [s.input_ids for s in again] == [s.input_ids for s in samples]  # a pure function of the seed
    assert samples[0].metadata["units"] > instance.min_units(0)  # the haystack fills the length
    with pytest.raises(tasks.LengthTooShortError, match="too short"):
        instance.samples(tok, instance.max_new_tokens + 40, limit=1)


# ---- the generators ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["mk_niah_basic", "mv_niah_basic"])
def test_needle_haystack(task, data_dir, tok):
    sample = tasks.get(f"ruler2_{task}", data_dir=data_dir).samples(tok, 2048, limit=1)[0]
    text = user_text(tok, sample)
    lines = [line for line in text.split("\n") if line.startswith("One of the special magic numbers for ")]
    pairs = [re.fullmatch(r"One of the special magic numbers for (\S+) is: (\d+)\.", line).groups() for line in lines]
    assert len(lines) == sample.metadata["units"] + len(sample.references)
    assert all(len(value) == 10 for _, value in pairs)  # --num_digits_v 10
    query = re.search(r"for (\S+) mentioned in the provided text\? ", text).group(1)
    assert [v for k, v in pairs if k == query] == sorted(sample.references, key=[v for _, v in pairs].index)
    counts = sorted({k: sum(1 for key, _ in pairs if key == k) for k, _ in pairs if k != query}.values())
    if task == "mk_niah_basic":
        assert text.startswith("A special magic number is hidden within the following text. Make sure to memorize "
                               "it. I will quiz you about the number afterwards.\n")
        assert text.endswith(f"\nWhat is the special magic number for {query} mentioned in the provided text? The "
                             f"special magic number for {query} mentioned in the provided text is")
        assert len(sample.references) == 1
    else:  # four values for the query; every haystack key four times (the last one possibly fewer)
        assert text.startswith("Some special magic numbers are hidden within the following text. Make sure to "
                               "memorize them. I will quiz you about the numbers afterwards.\n")
        assert text.endswith(" The special magic numbers for " + query + " mentioned in the provided text are")
        assert len(sample.references) == 4 and set(counts[1:]) == {4} and counts[0] <= 4


def blocks(text: str, label: str) -> list[tuple[str, str]]:
    """``(index, body)`` of every ``<label> <7 digits>:`` block (blocks end at a blank line)."""
    body = text.split("\n\n", 1)[1]
    found = re.finditer(rf"^{label} (\d{{7}}):\s?(.*?)(?=\n\n|\Z)", body, re.M | re.S)
    return [(m.group(1), m.group(2)) for m in found]


def mmlu_text(row: dict) -> str:
    return " ".join((row["question"] + "".join(f"\n{o}. {c}" for o, c in zip("ABCD", row["choices"]))).split())


def test_mmlu_questions_indices_orders_and_answers(data_dir, tok):
    import pyarrow.parquet as pq

    root = corpora.data_root(data_dir) / "mmlu" / "all"
    test_rows = pq.read_table(root / "test-00000-of-00001.parquet").to_pylist()
    auxiliary = {mmlu_text(r): r for r in pq.read_table(root / "auxiliary_train-00000-of-00001.parquet").to_pylist()}
    targets = {mmlu_text(r): r for r in test_rows}
    seen_targets = []
    for task in ("mk_niah_easy", "mk_niah_medium", "mk_niah_hard", "mv_niah_easy", "mv_niah_medium", "mv_niah_hard"):
        for sample in tasks.get(f"ruler2_{task}", data_dir=data_dir).samples(tok, SHORTEST, limit=3):
            text = user_text(tok, sample)
            questions = blocks(text.split("\n\nHere are some examples")[0], "Question")
            asked = re.findall(r"Question (\d{7}) from the context", text.rsplit("\n\n", 1)[-1])[-1]
            (target,) = [(i, q) for i, q in questions if q in targets]
            assert target[0] == asked and {q for _, q in questions} - {target[1]} <= set(auxiliary)
            assert len(questions) == sample.metadata["units"] + 1
            counts = {i: sum(1 for j, _ in questions if j == i) for i, _ in questions}
            assert max(counts.values()) <= (4 if task.startswith("mv") else 1), task
            same = [q for i, q in questions if i == asked]
            if task.startswith("mk"):
                seen_targets.append(target[1])
            if task == "mk_niah_easy":
                assert text.startswith("Below are some questions. I will ask you to copy one of them. Please copy and "
                                       "paste the question you find.\n\nQuestion ")
                assert text.endswith(f"\n\nPlease copy the Question {asked} from the context.")
                assert sample.references == [target[1]]
            elif task in ("mk_niah_medium", "mk_niah_hard"):
                assert "inside \\boxed\\{\\}.\n\nQuestion " in text
                shots = text.split("Here are some examples to help you understand the task:\n\n")[1].split(
                    "\n\nHere is the actual task you need to solve:\n\n")[0].split("\n\n")
                assert len(shots) == 5
                for shot in shots:
                    index = re.search(r"Question (\d{7})", shot).group(1)
                    (shown,) = [q for i, q in questions if i == index]
                    letter = "ABCD"[auxiliary[shown]["answer"]]
                    solution = f"\nSolution: \\boxed{{{letter}}}"
                    if task == "mk_niah_hard":
                        assert shot == f"Please solve the Question {index} from the context with an answer from " \
                                       f"A, B, C, D.{solution}"
                    else:
                        assert shot == f"Please copy the Question {index} from the context and then solve it with an " \
                                       f"answer from A, B, C, D.\nQuestion {index}: {shown}{solution}"
                assert sample.references == ["ABCD"[targets[target[1]]["answer"]]]
            elif task == "mv_niah_easy":
                assert text.endswith(f"\n\nPlease find and copy all the Question {asked} from the context.")
                assert sample.references == same
            else:  # the k-th question of that index, k counted from 1 in context order
                k = same.index(target[1]) + 1
                order = {1: "1st", 2: "2nd", 3: "3rd", 4: "4th"}[k]
                request = f"copy the {order} (1 indexed) Question {asked}"
                assert text.endswith(f"then {request} at the end." if task == "mv_niah_medium" else
                                     f"Please {request} from the context.")
                assert sample.references == [target[1]]
    assert len(set(seen_targets)) == 3  # three test questions per task, drawn without replacement


def test_hotpotqa_documents_and_answers(data_dir, tok):
    root = corpora.data_root(data_dir) / "ruler"
    dev = json.loads((root / "hotpotqa.json").read_text())
    train = {f"{t}\n{''.join(s)}" for item in json.loads((root / "hotpotqa_train.json").read_text())
             for t, s in item["context"]}
    for task in ("qa_basic", "qa_easy", "qa_medium", "qa_hard"):
        for index, sample in enumerate(tasks.get(f"ruler2_{task}", data_dir=data_dir).samples(tok, 2048, limit=2)):
            text, item = user_text(tok, sample), dev[index]
            documents = blocks(text, "Document")
            supporting = {t for t, _ in item["supporting_facts"]}
            own = {f"{t}\n{''.join(s)}": t in supporting for t, s in item["context"]}
            texts = [d for _, d in documents]
            assert set(own) <= set(texts) and set(texts) - set(own) <= train  # its ten documents among train ones
            assert len(documents) == sample.metadata["units"] + len(own)
            gold = [i for i, d in documents if own.get(d)]
            if task == "qa_basic":
                quoted = text.split("\n\nText: ")[1].removesuffix("\nMost relevant document index:")
                assert own[quoted] and sample.references == [i for i, d in documents if d == quoted]
            elif task == "qa_easy":
                assert text.endswith(f"\n\nQuestion: {item['question']}\nIndex of the most relevant document that can "
                                     "help answer the question:")
                assert sorted(sample.references) == sorted(gold)
            else:
                assert sample.references == [item["answer"]]
                assert text.endswith(f"based on the documents you find.\n\nQuestion: {item['question']}"
                                     if task == "qa_medium" else
                                     f"based on the documents.\n\nQuestion: {item['question']}")


def test_missing_corpora_name_their_files(data_dir, tmp_path, tok):
    cases = [("ruler2_mk_niah_easy", "mmlu/all/test-00000-of-00001.parquet"), ("ruler2_qa_hard", "ruler/hotpotqa.json")]
    for name, path in cases:
        with pytest.raises(FileNotFoundError) as err:
            tasks.get(name, data_dir=str(tmp_path)).samples(tok, SHORTEST, limit=1)
        assert str(tmp_path / path) in str(err.value) and "\n" not in str(err.value)
    (tmp_path / "ruler").mkdir()
    (tmp_path / "ruler" / "hotpotqa.json").write_text(json.dumps([hotpotqa_item(random.Random(0), 0)]))
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "ruler" / "hotpotqa_train.json"))):
        tasks.get("ruler2_qa_hard", data_dir=str(tmp_path)).samples(tok, SHORTEST, limit=1)
    (tmp_path / "ruler" / "hotpotqa.json").write_text(json.dumps([{**hotpotqa_item(random.Random(0), 0),
                                                                   "supporting_facts": []}]))
    ruler_data._load.cache_clear()
    with pytest.raises(ValueError, match="supporting facts.*no supporting document"):
        tasks.get("ruler2_qa_hard", data_dir=str(tmp_path)).samples(tok, SHORTEST, limit=1)


def test_hotpotqa_hub_rows_keep_the_supporting_facts(data_dir):
    dev = json.loads((corpora.data_root(data_dir) / "ruler" / "hotpotqa.json").read_text())
    rows = [{"id": item["_id"], "question": item["question"], "answer": item["answer"],
             "supporting_facts": {"title": [t for t, _ in item["supporting_facts"]],
                                  "sent_id": [i for _, i in item["supporting_facts"]]},
             "context": {"title": [t for t, _ in item["context"]], "sentences": [s for _, s in item["context"]]}}
            for item in dev]
    converted = ruler_data.hotpotqa_from_rows(rows)
    assert ruler_data.read_hotpotqa_supported(converted) == ruler_data.read_hotpotqa_supported(dev)
    assert ruler_data.read_hotpotqa_documents(converted) == ruler_data.read_hotpotqa_documents(dev)


# ---- the scorers ------------------------------------------------------------------------------------------------


def levenshtein(a: list[str], b: list[str]) -> int:
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def upstream_ruler2(match_type: str, generation: str, references: list[str]) -> float:
    """``eval_ruler2``'s ``string_match_{all,part,2steps}_single`` as its code reads."""
    preds = generation
    if "</think>" in preds:
        preds = preds.split("</think>")[-1]
    if "Answer:" in preds:
        preds = preds.split("Answer:")[-1]
    if match_type == "2steps":
        preds = preds.split("\n\n")[-1]
    if match_type == "part":
        preds = re.sub(r"Document \d+:(?:.*\n)+?\n", "", preds)

    def one(r: str) -> float:
        h_words, r_words = preds.lower().split(), r.lower().split()
        wer = levenshtein(h_words, r_words) / len(r_words) if r_words else float("inf")
        return max(1.0 if r.lower() in preds.lower() else 0.0, 1 - wer)

    values = [one(r) for r in references]
    return max(values) if match_type == "part" else sum(values) / len(values)


def upstream_choice(text: str) -> str | None:
    """`mcq.py`'s ``extract_letter`` with `math_grader.extract_answer` (boxed), as their code reads."""
    parsed = None
    if "\\boxed" in text:
        idx, open_braces, right = text.rfind("\\boxed"), 0, None
        for i in range(idx, len(text)):
            if text[i] == "{":
                open_braces += 1
            if text[i] == "}":
                open_braces -= 1
                if open_braces == 0:
                    right = i
                    break
        retval = text[idx:right + 1] if right is not None else None
        if retval and retval.startswith("\\boxed{") and retval.endswith("}"):
            parsed = retval[len("\\boxed{"):-1]
    if parsed is not None and len(parsed) != 1:
        found = re.findall(r"\b[A-J]\b(?!.*\b[A-J]\b)", parsed, re.DOTALL)
        if found:
            parsed = found[-1].strip()
    if parsed is None:
        found = re.findall(r"(?i)[\*\_]{0,2}Answer[\*\_]{0,2}\s*:[\s\*\_]{0,2}\s*([A-Z])(?![a-zA-Z0-9])", text)
        if found:
            parsed = found[-1].strip()
    return parsed


def generated_pairs(rng: random.Random, n: int) -> list[tuple[str, list[str]]]:
    """Responses beside references: exact, partial and reordered copies, other case, reasoning before ``</think>``,
    ``Answer:`` lead-ins, copied document blocks, paragraphs, empty and unrelated text."""
    words = "the Question river number stone Paris 1234567 blue of document magic is B".split()
    pairs = []
    for _ in range(n):
        references = [" ".join(rng.choice(words) for _ in range(rng.randint(0 if rng.random() < 0.05 else 1, 12)))
                      for _ in range(rng.randint(1, 4))]
        pieces = []
        for reference in references:
            tokens = reference.split()
            kind = rng.randrange(6)
            if kind == 1 and tokens:
                del tokens[rng.randrange(len(tokens))]
            elif kind == 2:
                tokens.insert(rng.randrange(len(tokens) + 1), rng.choice(words))
            elif kind == 3:
                rng.shuffle(tokens)
            elif kind == 4:
                tokens = [t.upper() for t in tokens]
            elif kind == 5:
                tokens = [rng.choice(words) for _ in range(rng.randint(0, 6))]
            pieces.append(" ".join(tokens))
        text = rng.choice(["\n", " ", "\n\n", ", "]).join(pieces)
        if rng.random() < 0.3:
            text = f"Document {rng.randint(1, 9999999)}:\n{rng.choice(references)}\nmore\n\n" + text
        if rng.random() < 0.3:
            text = rng.choice(["Answer: ", "So the Answer: ", "Answer:", "Answer: " + text + "\nAnswer: "]) + text
        if rng.random() < 0.2:
            text = "thinking about " + rng.choice(references) + " </think>" * rng.randint(1, 2) + text
        if rng.random() < 0.2:
            text = text + "\n\n" + rng.choice(references + [""])
        pairs.append((text, references))
    return pairs


@pytest.mark.parametrize("metric", ["all", "part", "2steps"])
def test_ruler2_scorer_agrees_with_upstream(metric):
    pairs = generated_pairs(random.Random(metric), 300)
    scores = []
    for text, references in pairs:
        ours, theirs = ruler2.score(metric, text, references), upstream_ruler2(metric, text, references)
        assert math.isclose(ours, theirs, abs_tol=1e-12), (text, references)
        assert 0.0 <= ours <= 1.0
        scores.append(ours)
    assert 0 < sum(s == 1.0 for s in scores) < len(scores) and any(0 < s < 1 for s in scores)


def choice_responses(rng: random.Random, n: int) -> list[str]:
    letters = "ABCDEFGHIJKab"
    templates = [
        "\\boxed{{{x}}}", "The answer is \\boxed{{{x}}}.", "\\boxed{{{x}}} then \\boxed{{{y}}}", "\\boxed{{({x})}}",
        "\\boxed{{\\text{{{x}}}}}", "\\boxed{{{x} or {y}}}", "\\boxed {{{x}}}", "\\boxed{{}}", "\\boxed{{{x}",
        "Answer: {x}", "answer:{x}", "**Answer**: {x}", "_Answer_ : {x}.", "Answer: {x}{y}", "Answer: {x}\nAnswer: {y}",
        "ANSWER: {x} because", "Final: {x}", "{x}", "", "The Answer is {x}", "\\boxed}}{x}{{\\boxed{{{y}}}",
        "Question 1234567: ...\nSolution: \\boxed{{{x}}}", "\\fbox{{{x}}}", "\\boxed{{{x}}} Answer: {y}",
    ]
    return [rng.choice(templates).format(x=rng.choice(letters), y=rng.choice(letters)) for _ in range(n)]


def test_multichoice_scorer_agrees_with_upstream():
    rng = random.Random(7)
    responses = choice_responses(rng, 400)
    results = []
    for text in responses:
        assert ruler2.choice(text) == upstream_choice(text), text
        gold = rng.choice("ABCD")
        sample = tasks.Sample("0", [], 1, [gold])
        score = tasks.get("ruler2_mk_niah_hard").score(text, sample)
        assert score == float(upstream_choice(text) == gold)
        results.append(score)
    assert 0 < sum(results) < len(results)


def test_ordinals_and_aggregate():
    assert [ruler2.ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111, 112)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st", "111th", "112th"]
    records = [{"score": s, "metadata": {}} for s in (1.0, 0.5, 0.0)]
    assert tasks.get("ruler2_qa_easy").aggregate(records) == {"score": 50.0}

