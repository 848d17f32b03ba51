"""RULER v2 (NVIDIA-NeMo/Skills, branch ``chsieh/ruler2`` @ 991a743, as NVIDIA/RULER's ``rulerv2-ns`` branch runs it):
12 tasks in three families of increasing difficulty, generated locally from a seed with the model's tokenizer.

Upstream's files: `dataset/ruler2/prepare.py` (the tasks and their arguments), `prepare_niah.py`, `prepare_mmlu.py`,
`prepare_qa.py` (the generators and prompts), `evaluation/evaluator/ruler.py` (``eval_ruler2``) and `mcq.py` (the
scorers), `ruler2_score.py` (the benchmark's score). The tasks, with their upstream names:

- ``mk_niah_basic``, ``mv_niah_basic``: RULER v1's niah generator (`ruler.Niah`) over a haystack of needles, words
  for keys and 10-digit numbers for values, one value (mk) or four (mv; the haystack's keys then come four times
  each, shuffled); upstream's two templates end the user turn with the answer's lead-in.
- ``mk_niah_easy`` … ``mv_niah_hard``: MMLU questions, each numbered ``Question <7-digit index>``: a haystack of the
  auxiliary train questions with one test question inserted at random. mk: every index is unique; copy the question
  (easy), copy and solve it with 5 examples (medium), solve it with 5 examples (hard). mv: every index comes four
  times; copy all of them (easy), copy all then the k-th (medium), copy the k-th (hard).
- ``qa_basic`` … ``qa_hard``: HotpotQA dev questions, their supporting and distractor documents among HotpotQA train
  documents, each ``Document <7-digit index>``: give the index of a quoted document (basic), of the documents that
  answer a question (easy); answer after copying the relevant documents (medium), answer (hard).

Scoring (``eval_ruler2``): the response after its last ``</think>`` and last ``Answer:``; for each reference,
``max(contained, 1 − WER)`` case-insensitive (word error rate by word-level edit distance); ``all`` averages over the
references, ``part`` takes the best after removing copied ``Document N:`` blocks (qa_*), ``2steps`` scores the
response's last paragraph (mv_niah_medium). mk_niah_medium and mk_niah_hard are multiple choice (`mcq.py`): the
letter in the last ``\\boxed{}`` (or the last ``Answer: X``) must be the gold letter. A task's score is the mean in
percent; the benchmark's, the equal mean of its 12 tasks (``ruler2_score.py``: the `official` protocol's equal mean).

Where elastic-bench differs:
- as for RULER (`ruler`): each sample draws from its own generator seeded by ``(seed, index)`` (upstream shares one
  global generator), the chat template is the tokenizer's own, the haystack is fitted by binary search below the
  first sample's size, and a run at length L fits the exact model input plus the answer budget into L;
- budgets: upstream's tasks set none (its run script passes 16,384 new tokens, a reasoning model's allowance); here
  each task's budget holds the answer it asks for (`TASKS`): 128 tokens for indices, numbers and letters, 1,024 for
  one question or the relevant documents, 2,048 for four or five questions;
- MMLU's 100 test questions per task are drawn with ``random.Random(f"ruler2:{seed}")`` and HotpotQA's train
  documents are sorted (upstream iterates a set, whose order changes with Python's hash seed).
"""

from __future__ import annotations

import random
import re
from collections import Counter

from . import ruler_data
from .base import Sample, register
from .ruler import NEEDLE, Niah, Ruler, random_value

SAMPLES = 100
"""Samples per task and length (upstream's ``--dataset_size`` default)."""

NIAH_SINGLE = (
    "A special magic {type_needle_v} is hidden within the following text. Make sure to memorize it. I will quiz you "
    "about the {type_needle_v} afterwards.\n{context}\nWhat is the special magic {type_needle_v} for {query} "
    "mentioned in the provided text? The special magic {type_needle_v} for {query} mentioned in the provided text is"
)
NIAH_MULTIPLE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize them. I will quiz "
    "you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} "
    "mentioned in the provided text? The special magic {type_needle_v} for {query} mentioned in the provided text are"
)
QUESTION_CONTEXTS = {
    "retrieve": "Below are some questions. I will ask you to copy one of them. Please copy and paste the question you "
                "find.\n\n{needles}",
    "niah": "Below are some questions. I will ask you to copy some of them. Please copy and paste the questions you "
            "find.\n\n{needles}",
    "solve": "Below are some questions. I will ask you to solve one of them. Please solve the question you find and "
             "make sure to put the answer (and only answer) inside \\boxed\\{{\\}}.\n\n{needles}",
}
QUESTION_PROBLEMS = {  # (task type, algorithm) → the request after the questions; {order} is "" or "2nd (1 indexed) "
    ("retrieve", "single"): "Please copy the {order}Question {i} from the context.",
    ("retrieve", "2steps"): "Please first copy all the Question {i} from the context and then copy the {order}Question "
                            "{i} at the end.",
    ("niah", "single"): "Please find and copy all the Question {i} from the context.",
    ("solve", "single"): "Please solve the Question {i} from the context with an answer from A, B, C, D.",
    ("solve", "2steps"): "Please copy the Question {i} from the context and then solve it with an answer from A, B, C, "
                         "D.",
}
QUESTION_EXAMPLES = {  # a worked example: its problem followed by this
    ("solve", "single"): "\nSolution:{solution}",
    ("solve", "2steps"): "\nQuestion {i}: {question}\nSolution:{solution}",
}
EXAMPLES = ("Here are some examples to help you understand the task:\n\n{examples}\n\nHere is the actual task you need "
            "to solve:\n\n")
DOCUMENT_PROMPTS = {  # (task type, query type or algorithm) → (the documents' lead-in, the request after them)
    ("retrieve", "doc"): (
        "Below are some documents. I will give you a text at the end. Please find the document index of the text. "
        "Only give me the index without any document contents.\n\n{needles}",
        "Text: {text}\nMost relevant document index:"),
    ("retrieve", "question"): (
        "Below are some documents. I will give you a question at the end. Please find the index of the most relevant "
        "document that can help answer the question. Only give me the index without any document contents.\n\n"
        "{needles}",
        "Question: {question}\nIndex of the most relevant document that can help answer the question:"),
    ("solve", "single"): (
        "Below are some documents. I will ask you to answer a question based on the documents. Please answer the "
        "question.\n\n{needles}",
        "Please answer the following question based on the documents.\n\nQuestion: {question}"),
    ("solve", "2steps"): (
        "Below are some documents. I will ask you to answer a question based on the documents. Please answer the "
        "question.\n\n{needles}",
        "Please first find and copy paste the documents relevant to the following question and then answer it based "
        "on the documents you find.\n\nQuestion: {question}"),
}


def response(prediction: str) -> str:
    """What ``eval_ruler2`` scores of a response: the text after its last ``</think>``, then after its last
    ``Answer:``."""
    return prediction.rsplit("</think>", 1)[-1].rsplit("Answer:", 1)[-1]


def word_error_rate(hypothesis: str, reference: str) -> float:
    """Word-level edit distance over the reference's word count (whitespace words); infinite for no words."""
    import editdistance  # lazy: only RULER v2's scoring needs it (a GPU machine may lack it)

    words = reference.split()
    return editdistance.eval(hypothesis.split(), words) / len(words) if words else float("inf")


def match(prediction: str, reference: str) -> float:
    """``max(1 if the reference is in the prediction, 1 − WER)``, both lowercased: in [0, 1]."""
    prediction, reference = prediction.lower(), reference.lower()
    return max(float(reference in prediction), 1 - word_error_rate(prediction, reference))


def score(metric: str, prediction: str, references: list[str]) -> float:
    """RULER v2's per-sample score in [0, 1] (``eval_ruler2``).

    ``all``: the mean over the references of `match`; ``2steps``: the same on the response's last paragraph (after
    its last blank line); ``part``: the best reference, after removing every ``Document N:`` block the response
    copied (up to the next blank line).
    """
    text = response(prediction)
    if metric == "part":
        text = re.sub(r"Document \d+:(?:.*\n)+?\n", "", text)
        return max(match(text, r) for r in references)
    if metric == "2steps":
        text = text.split("\n\n")[-1]
    elif metric != "all":
        raise ValueError(f"unknown RULER v2 metric {metric!r}; use 'all', 'part' or '2steps'")
    return sum(match(text, r) for r in references) / len(references)


def boxed(text: str) -> str | None:
    """The contents of the last ``\\boxed{...}`` with balanced braces (`math_grader.extract_answer`), or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    depth = 0
    for end in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0 and text[end] == "}":
            inner = text[start:end + 1].removeprefix("\\boxed{")
            return inner[:-1] if inner != text[start:end + 1] else None
    return None


def choice(prediction: str) -> str | None:
    """The letter a multiple-choice response gives (`mcq.py`): the last ``\\boxed{}``'s contents, reduced to its last
    standalone letter A-J when it is not one character; without a box, the letter of the last ``Answer: X``
    (any case, ``*`` / ``_`` around the word allowed)."""
    found = boxed(prediction)
    if found is not None and len(found) != 1:
        letters = re.findall(r"\b[A-J]\b", found)
        found = letters[-1] if letters else found
    if found is None:
        answers = re.findall(r"(?i)answer[*_]{0,2}\s*:[\s*_]{0,2}\s*([a-z])(?![a-z0-9])", prediction)
        found = answers[-1] if answers else None
    return found


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``21st``, … (inflect's ``ordinal``)."""
    return f"{n}{'th' if n % 100 in (11, 12, 13) else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


class Ruler2(Ruler):
    """A RULER v2 task: a generator with the arguments of one `TASKS` entry, its metric and its answer budget."""

    samples_default = SAMPLES
    category = "sensitive"  # the needle, question or document may lie anywhere in the context
    max_new_tokens = 128  # set per task from `TASKS`

    def score(self, prediction: str, sample: Sample) -> float:
        if self.metric == "choice":
            return float(choice(prediction) == sample.references[0])
        return score(self.metric, prediction, sample.references)


class Needles(Ruler2, Niah):
    """mk_niah_basic, mv_niah_basic (`prepare_niah.py`): v1's niah generator over a haystack of needles."""

    identities = frozenset({"generator:ruler.niah"})
    step_below_4k = 5

    @property
    def step(self) -> int:
        return max(5, self.args["num_needle_v"] * self.num_keys)

    def distractor_needles(self, units, rng):
        """With several values per key, the haystack's keys come that many times each, the lines shuffled."""
        a, repeats = self.args, self.args["num_needle_v"]
        if repeats == 1:
            return super().distractor_needles(units, rng)
        values = [self.value(rng) for _ in range(units)]
        keys = ([random_value(a["type_needle_k"], rng) for _ in range(-(-units // repeats))] * repeats)[:units]
        lines = [NEEDLE.format(type_needle_v=a["type_needle_v"], key=k, value=v) for k, v in zip(keys, values)]
        rng.shuffle(lines)
        return lines

    def prompt(self, context, query, type_v, single):
        template = NIAH_SINGLE if single else NIAH_MULTIPLE
        return template.format(type_needle_v=type_v, context=context, query=query), ""


class Questions(Ruler2):
    """mk_niah_easy … mv_niah_hard (`prepare_mmlu.py`): MMLU questions under random 7-digit indices."""

    generator = "mmlu"
    identities = frozenset({"generator:ruler2.mmlu", "dataset:mmlu"})
    sources = (ruler_data.MMLU_TEST, ruler_data.MMLU_AUXILIARY)
    step = step_below_4k = 10

    def prepare(self, tokenizer, length, seed):
        self._needles = ruler_data.corpus("mmlu_test", self.data_dir)
        self._haystack = ruler_data.corpus("mmlu_auxiliary", self.data_dir)
        drawn = random.Random(f"ruler2:{seed}")
        self._chosen = drawn.sample(range(len(self._needles)), min(SAMPLES, len(self._needles)))

    def num_samples(self, limit):
        return len(self._chosen) if limit is None else min(limit, len(self._chosen))

    def min_units(self, index):
        return max(10, self.args["fewshot"])

    def build(self, units, index, seed, length):
        a, rng, haystack = self.args, self._rng(seed, index), self._haystack
        repeats = -(-units // len(haystack))  # the auxiliary questions repeat only beyond their number
        context = [dict(haystack[i // repeats]) for i in rng.sample(range(len(haystack) * repeats), units)]
        if a["num_order"]:  # each index serves num_order questions
            numbers = [random_value("numbers", rng) for _ in range(-(-(units + 1) // a["num_order"]))] * a["num_order"]
        else:
            numbers = [random_value("numbers", rng) for _ in range(units + 1)]
        rng.shuffle(numbers)
        for question, number in zip(context, numbers):
            question["index"] = number
        rng.shuffle(context)
        examples = rng.sample(context, a["fewshot"])
        target = {**self._needles[self._chosen[index]], "index": numbers[units]}
        context.insert(rng.randint(0, len(context)), target)
        seen: Counter[str] = Counter()
        for question in context:
            seen[question["index"]] += 1
            question["order"] = f"{ordinal(seen[question['index']])} (1 indexed) " if a["num_order"] else ""
        kind = (a["task_type"], a["algo_type"])
        shots = "\n\n".join((QUESTION_PROBLEMS[kind] + QUESTION_EXAMPLES[kind]).format(i=q["index"], **q)
                            for q in examples)
        needles = "\n\n".join(f"Question {q['index']}: {q['question']}" for q in context)
        text = (QUESTION_CONTEXTS[a["task_type"]].format(needles=needles) + "\n\n"
                + (EXAMPLES.format(examples=shots) if examples else "")
                + QUESTION_PROBLEMS[kind].format(i=target["index"], order=target["order"]))
        if a["task_type"] == "solve":
            answers = [target["answer"]]
        elif a["task_type"] == "niah":
            answers = [q["question"] for q in context if q["index"] == target["index"]]
        else:
            answers = [target["question"]]
        return text, "", answers


class Documents(Ruler2):
    """qa_basic … qa_hard (`prepare_qa.py`): HotpotQA documents under random 7-digit indices."""

    generator = "qa"
    identities = frozenset({"generator:ruler2.qa", "dataset:hotpotqa"})
    sources = (ruler_data.HOTPOTQA, ruler_data.HOTPOTQA_TRAIN)
    metric = "part"
    step = step_below_4k = 5

    def prepare(self, tokenizer, length, seed):
        self._questions = ruler_data.corpus("hotpotqa_supported", self.data_dir)
        self._documents = ruler_data.corpus("hotpotqa_train", self.data_dir)

    def num_samples(self, limit):
        total = min(SAMPLES, len(self._questions))
        return total if limit is None else min(limit, total)

    def min_units(self, index):
        return 5

    def build(self, units, index, seed, length):
        a, rng, question, documents = self.args, self._rng(seed, index), self._questions[index], self._documents
        gold = [(random_value("numbers", rng), text) for text in question["gold"]]
        distractors = [(random_value("numbers", rng), text) for text in question["distractors"]]
        others = max(1, len(documents) - len({text for _, text in gold + distractors}))
        repeats = -(-units // others)  # the train documents repeat only beyond their number
        context = [(random_value("numbers", rng), documents[i // repeats])
                   for i in rng.sample(range(len(documents) * repeats), units)] + gold + distractors
        rng.shuffle(context)
        lead, problem = DOCUMENT_PROMPTS[(a["task_type"], a["variant"])]
        needles = "\n\n".join(f"Document {number}:\n{text}" for number, text in context)
        text = lead.format(needles=needles) + "\n\n" + problem.format(text=gold[0][1], question=question["query"])
        if a["task_type"] == "solve":
            answers = question["outputs"]
        elif a["variant"] == "doc":
            answers = [gold[0][0]]
        else:
            answers = [number for number, _ in gold]
        return text, "", answers


def _needles(values: int) -> dict:
    """`prepare_niah.py`'s arguments: one word key, ``values`` 10-digit values, a haystack of needles."""
    return {"type_haystack": "needle", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 1,
            "num_needle_v": values, "num_needle_q": 1, "num_digits_v": 10}


def _questions(fewshot: int, num_order: int, task_type: str, algo_type: str) -> dict:
    """`prepare_mmlu.py`'s arguments (always ``--dataset mmlu --prompt_type instruct``)."""
    return {"fewshot": fewshot, "num_order": num_order, "task_type": task_type, "algo_type": algo_type}


TASKS: dict[str, tuple[type[Ruler2], dict, str, int]] = {
    # upstream task → (generator, its arguments in `prepare.py`, metric, answer budget)
    "mk_niah_basic": (Needles, _needles(1), "all", 128),
    "mk_niah_easy": (Questions, _questions(0, 0, "retrieve", "single"), "all", 1024),
    "mk_niah_medium": (Questions, _questions(5, 0, "solve", "2steps"), "choice", 1024),
    "mk_niah_hard": (Questions, _questions(5, 0, "solve", "single"), "choice", 128),
    "mv_niah_basic": (Needles, _needles(4), "all", 128),
    "mv_niah_easy": (Questions, _questions(0, 4, "niah", "single"), "all", 2048),
    "mv_niah_medium": (Questions, _questions(0, 4, "retrieve", "2steps"), "2steps", 2048),
    "mv_niah_hard": (Questions, _questions(0, 4, "retrieve", "single"), "all", 1024),
    "qa_basic": (Documents, {"task_type": "retrieve", "variant": "doc"}, "part", 128),
    "qa_easy": (Documents, {"task_type": "retrieve", "variant": "question"}, "part", 128),
    "qa_medium": (Documents, {"task_type": "solve", "variant": "2steps"}, "part", 1024),
    "qa_hard": (Documents, {"task_type": "solve", "variant": "single"}, "part", 128),
}
"""The 12 tasks in upstream's order; ``variant`` is `prepare_qa.py`'s query type (retrieve) or algorithm (solve)."""

for _name, (_generator, _args, _metric, _budget) in TASKS.items():
    register(f"ruler2_{_name}", group="ruler2")(type(f"Ruler2_{_name}", (_generator,), {
        "args": _args, "metric": _metric, "max_new_tokens": _budget,
        "__doc__": f"RULER v2 {_name}: {_generator.__doc__}"}))
