"""RULER's inputs: wonderwords word lists, the needle-key vocabulary, and the external corpora (essays, SQuAD,
HotpotQA, cwe's long word list, nltk's punkt model), read as `scripts/data/synthetic/*.py` reads them; and RULER v2's
(HotpotQA's dev questions with their supporting documents and its train documents, MMLU's test and auxiliary train
questions), read as NeMo-Skills' `dataset/ruler2/prepare_*.py` read them."""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

from . import corpora
from .corpora import Source, data_root, fetch
from .records import read_records

ESSAYS = Source(
    "RULER's Paul Graham essay haystack",
    ("ruler/PaulGrahamEssays.json",),
    "It is the JSON file {\"text\": ...} that RULER's scripts/data/synthetic/json/download_paulgraham_essay.py writes.",
)
SQUAD = Source(
    "SQuAD v2.0 dev set (RULER qa_1)",
    ("ruler/squad.json",),
    "It is dev-v2.0.json from the SQuAD website, renamed (RULER's download_qa_dataset.sh does the same).",
    hub_rows=("rajpurkar/squad_v2", None, "validation"),
)
HOTPOTQA = Source(
    "HotpotQA dev distractor set (RULER qa_2, RULER v2's qa tasks)",
    ("ruler/hotpotqa.json",),
    "It is hotpot_dev_distractor_v1.json from the HotpotQA website, renamed (as RULER's download_qa_dataset.sh).",
    hub_rows=("hotpotqa/hotpot_qa", "distractor", "validation"),
)
HOTPOTQA_TRAIN = Source(
    "HotpotQA train set (RULER v2's document haystack)",
    ("ruler/hotpotqa_train.json",),
    "It is hotpot_train_v1.1.json from the HotpotQA website, renamed.",
    hub_rows=("hotpotqa/hotpot_qa", "distractor", "train"),
)
MMLU_TEST = Source(
    "MMLU test questions (RULER v2's needles)",
    ("mmlu/all/test-00000-of-00001.parquet",),
    "It is all/test-00000-of-00001.parquet of the cais/mmlu dataset on the Hugging Face hub (reading it needs "
    "pyarrow: pip install 'elastic-bench[hub]').",
    hub=("cais/mmlu", "all/test-00000-of-00001.parquet"),
)
MMLU_AUXILIARY = Source(
    "MMLU auxiliary train questions (RULER v2's question haystack)",
    ("mmlu/all/auxiliary_train-00000-of-00001.parquet",),
    "It is all/auxiliary_train-00000-of-00001.parquet of the cais/mmlu dataset on the Hugging Face hub (reading it "
    "needs pyarrow: pip install 'elastic-bench[hub]').",
    hub=("cais/mmlu", "all/auxiliary_train-00000-of-00001.parquet"),
)
ENGLISH_WORDS = Source(
    "RULER's cwe word list for inputs with more distinct words than wonderwords has",
    ("ruler/english_words.json",),
    "It is scripts/data/synthetic/json/english_words.json of NVIDIA/RULER (a Git LFS file: fetch it with git lfs).",
    when="for inputs of more distinct words than wonderwords' lists hold (the longest lengths)",
)
PUNKT = Source(
    "nltk's punkt sentence model, needed by RULER's essay haystack",
    ("nltk_data/tokenizers/punkt_tab/english/",),
    "Run `python -m nltk.downloader -d DIR/nltk_data punkt_tab` (or install it in nltk's own data path).",
)


def wonderwords_list(name: str) -> list[str]:
    """One wonderwords list (``nounlist.txt``, ``adjectivelist.txt``, ``verblist.txt``) read as RULER reads it:
    one entry per line, trailing whitespace stripped (so multi-word entries such as "ad hoc" stay whole)."""
    from wonderwords.random_word import _get_words_from_text_file

    return _get_words_from_text_file(name)


class SortedPairs(Sequence):
    """``sorted(set(f"{a}-{n}" for a in adjectives for n in nouns))`` as a lazy sequence.

    The full set has millions of strings (seconds to build); indexing here is O(log) after an O(A log A) setup, and
    ``random.choice`` on it returns exactly what it returns on the materialised list for the same generator state.
    All strings of one adjective share the prefix ``a + "-"``, so they form one run ordered by noun; runs of
    adjectives whose prefixes nest (``"blue-"`` and ``"blue-eyed-"``) interleave and are materialised together.
    """

    def __init__(self, adjectives: list[str], nouns: list[str]):
        self._nouns = sorted(set(nouns))
        self._runs: list[str | list[str]] = []  # a prefix (one adjective) or a materialised group
        starts: list[int] = []
        total = 0
        prefixes = sorted({a + "-" for a in adjectives})
        i = 0
        while i < len(prefixes):
            j = i + 1
            while j < len(prefixes) and prefixes[j].startswith(prefixes[i]):
                j += 1
            if j == i + 1:
                run: str | list[str] = prefixes[i]
                size = len(self._nouns)
            else:
                run = sorted({p + n for p in prefixes[i:j] for n in self._nouns})
                size = len(run)
            self._runs.append(run)
            starts.append(total)
            total += size
            i = j
        self._starts = starts
        self._len = total

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._len))]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("SortedPairs index out of range")
        k = bisect.bisect_right(self._starts, index) - 1
        run, offset = self._runs[k], index - self._starts[k]
        return run + self._nouns[offset] if isinstance(run, str) else run[offset]


@lru_cache(maxsize=1)
def needle_words() -> SortedPairs:
    """RULER's word keys: ``adjective-noun`` over wonderwords' lists, sorted and de-duplicated."""
    return SortedPairs(wonderwords_list("adjectivelist.txt"), wonderwords_list("nounlist.txt"))


@lru_cache(maxsize=1)
def common_words() -> list[str]:
    """cwe's vocabulary: wonderwords nouns + adjectives + verbs, sorted and de-duplicated."""
    lists = ("nounlist.txt", "adjectivelist.txt", "verblist.txt")
    return sorted(set(w for name in lists for w in wonderwords_list(name)))


def read_squad(data: dict) -> tuple[list[dict], list[str]]:
    """Answerable SQuAD questions in file order, each with its gold paragraph and the other paragraphs of its article
    (``more_context``), indexing the sorted set of all paragraphs."""
    docs = sorted({p["context"] for article in data["data"] for p in article["paragraphs"]})
    index = {doc: i for i, doc in enumerate(docs)}
    questions = []
    for article in data["data"]:
        article_docs = [index[p["context"]] for p in article["paragraphs"]]
        for p in article["paragraphs"]:
            gold = index[p["context"]]
            for qa in p["qas"]:
                if not qa["is_impossible"]:
                    questions.append({
                        "query": qa["question"],
                        "outputs": [a["text"] for a in qa["answers"]],
                        "context": [gold],
                        "more_context": [i for i in article_docs if i != gold],
                    })
    return questions, docs


def read_hotpotqa(data: list) -> tuple[list[dict], list[str]]:
    """HotpotQA questions in file order; documents are ``"title\\nsentences"`` over the sorted set of all of them."""
    docs = sorted({f"{title}\n{''.join(sents)}" for item in data for title, sents in item["context"]})
    index = {doc: i for i, doc in enumerate(docs)}
    questions = [
        {
            "query": item["question"],
            "outputs": [item["answer"]],
            "context": [index[f"{title}\n{''.join(sents)}"] for title, sents in item["context"]],
        }
        for item in data
    ]
    return questions, docs


def _paragraph(title: str, sentences: list[str]) -> str:
    return f"{title}\n{''.join(sentences)}"


def read_hotpotqa_supported(data: list) -> list[dict]:
    """RULER v2's HotpotQA needles, in file order: ``{query, outputs, gold, distractors}``, the documents
    (``"title\\nsentences"``) of the question's supporting facts and the others, each in context order."""
    questions = []
    for item in data:
        titles = {title for title, _ in item["supporting_facts"]}
        documents = [(title in titles, _paragraph(title, sentences)) for title, sentences in item["context"]]
        if not any(supporting for supporting, _ in documents):
            raise ValueError(f"question {item.get('_id')!r} has no supporting document")
        questions.append({"query": item["question"], "outputs": [item["answer"]],
                          "gold": [d for supporting, d in documents if supporting],
                          "distractors": [d for supporting, d in documents if not supporting]})
    return questions


def read_hotpotqa_documents(data: list) -> list[str]:
    """Every document of a HotpotQA file, sorted and de-duplicated (RULER v2's haystack of train documents)."""
    return sorted({_paragraph(title, sentences) for item in data for title, sentences in item["context"]})


def read_mmlu(rows: list[dict]) -> list[dict]:
    """MMLU rows (``question``, ``choices``, ``answer`` index) as RULER v2 writes them: ``{question, solution,
    answer}``, the question followed by its lettered choices with every whitespace run made one space, the solution
    ``" \\boxed{<letter>}"``."""
    items = []
    for row in rows:
        choices, letter = list(row["choices"]), "ABCD"[row["answer"]]
        if len(choices) != 4:
            raise ValueError(f"an MMLU question has {len(choices)} choices, not 4")
        text = row["question"] + "".join(f"\n{option}. {choice}" for option, choice in zip("ABCD", choices))
        items.append({"question": re.sub(r"\s+", " ", text), "solution": f" \\boxed{{{letter}}}", "answer": letter})
    return items


def squad_from_rows(rows: list[dict]) -> dict:
    """SQuAD's JSON structure (articles → paragraphs → qas) from hub rows (title, context, question, id, answers),
    which list the questions in file order."""
    articles: list[dict] = []
    for row in rows:
        if not articles or articles[-1]["title"] != row["title"]:
            articles.append({"title": row["title"], "paragraphs": []})
        paragraphs = articles[-1]["paragraphs"]
        if not paragraphs or paragraphs[-1]["context"] != row["context"]:
            paragraphs.append({"context": row["context"], "qas": []})
        texts = list(row["answers"]["text"])
        paragraphs[-1]["qas"].append(
            {"question": row["question"], "id": row["id"], "is_impossible": not texts,
             "answers": [{"text": t} for t in texts]}
        )
    return {"data": articles}


def hotpotqa_from_rows(rows: list[dict]) -> list[dict]:
    """HotpotQA's JSON structure (``context`` as ``[title, sentences]`` pairs) from hub rows."""
    return [
        {"_id": row["id"], "question": row["question"], "answer": row["answer"],
         "supporting_facts": [[t, i] for t, i in zip(row["supporting_facts"]["title"],
                                                     row["supporting_facts"]["sent_id"])],
         "context": [[t, list(s)] for t, s in zip(row["context"]["title"], row["context"]["sentences"])]}
        for row in rows
    ]


_LOADERS = {  # kind → (source, parse, its hub rows → official JSON, where the source has hub rows)
    "essay": (ESSAYS, lambda data: re.sub(r"\s+", " ", data["text"]).split(" "), None),
    "english_words": (ENGLISH_WORDS, lambda data: list(data.values()), None),
    "squad": (SQUAD, read_squad, squad_from_rows),
    "hotpotqa": (HOTPOTQA, read_hotpotqa, hotpotqa_from_rows),
    "hotpotqa_supported": (HOTPOTQA, read_hotpotqa_supported, hotpotqa_from_rows),
    "hotpotqa_train": (HOTPOTQA_TRAIN, read_hotpotqa_documents, hotpotqa_from_rows),
    "mmlu_test": (MMLU_TEST, read_mmlu, None),
    "mmlu_auxiliary": (MMLU_AUXILIARY, read_mmlu, None),
}


def source(kind: str) -> Source:
    """The corpus file of ``kind``: ``essay``, ``english_words``, ``squad``, ``hotpotqa`` (v1), or RULER v2's
    ``hotpotqa_supported``, ``hotpotqa_train``, ``mmlu_test``, ``mmlu_auxiliary``."""
    return _LOADERS[kind][0]


_SHAPES = {  # kind → what its file must hold (for messages), and whether a parsed corpus is one
    "essay": ('a JSON object {"text": "<essays>"} with some text', lambda words: any(words)),
    "english_words": ("a JSON object whose values are words",
                      lambda words: bool(words) and all(isinstance(w, str) for w in words)),
    "squad": ("SQuAD v2.0 dev JSON (data → paragraphs → qas) with an answerable question", lambda qa: bool(qa[0])),
    "hotpotqa": ("HotpotQA dev JSON (a list of questions with their context)", lambda qa: bool(qa[0])),
    "hotpotqa_supported": ("HotpotQA dev JSON (questions with their context and supporting facts)", bool),
    "hotpotqa_train": ("HotpotQA train JSON (a list of questions with their context)", bool),
    "mmlu_test": ("MMLU rows (question, choices, answer)", bool),
    "mmlu_auxiliary": ("MMLU rows (question, choices, answer)", bool),
}


@lru_cache(maxsize=16)
def _load(kind: str, root: Path | None):
    """The parsed corpus of ``kind``; ValueError naming the file (or hub dataset) and what it must hold when it is
    not JSON of that shape, or holds nothing (a cell reading it fails with that message; the run goes on)."""
    corpus, parse, convert = _LOADERS[kind]
    try:
        path = fetch(corpus, root)
    except FileNotFoundError as missing:
        if corpus.hub_rows is None:
            raise
        repo, config, split = corpus.hub_rows
        try:
            data, where = convert(corpora.hub_rows(repo, config, split)), f"the hub dataset {repo}"
        except Exception as err:  # noqa: BLE001  (offline, no `datasets`, changed schema: provide the file)
            note = f"the hub dataset {repo} could not be read either: {type(err).__name__}"
            raise FileNotFoundError(f"{missing} ({note})") from None
    else:
        where = str(path)
        try:
            data = read_records(path) if path.suffix == ".parquet" else json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:  # not UTF-8 or not JSON, not parquet, a folder, unreadable
            kind_of_file = "parquet" if path.suffix == ".parquet" else "JSON"
            raise ValueError(f"{where} is not a readable {kind_of_file} file ({err}); expected {_SHAPES[kind][0]}"
                             ) from None
    expected, valid = _SHAPES[kind]
    try:
        parsed = parse(data)
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as err:
        raise ValueError(f"{where} is not {expected} ({type(err).__name__}: {err})") from None
    if not valid(parsed):
        raise ValueError(f"{where} holds nothing to read; expected {expected}")
    return parsed


def essay_words(data_dir) -> list[str]:
    """The essay corpus, whitespace-normalised and split on single spaces (the haystack unit is the word)."""
    return _load("essay", data_root(data_dir))


def english_words(data_dir) -> list[str]:
    """The values of RULER's ``english_words.json``."""
    return _load("english_words", data_root(data_dir))


def qa_dataset(name: str, data_dir) -> tuple[list[dict], list[str]]:
    """``(questions, documents)`` of ``squad`` or ``hotpotqa`` (see `read_squad`, `read_hotpotqa`)."""
    return _load(name, data_root(data_dir))


def corpus(kind: str, data_dir):
    """The parsed corpus of ``kind`` (see `source`) for RULER v2: `read_hotpotqa_supported`,
    `read_hotpotqa_documents` or `read_mmlu` of its file."""
    return _load(kind, data_root(data_dir))


def sentence_splitter(data_dir) -> Callable[[str], list[str]]:
    """nltk's English punkt sentence splitter (``sent_tokenize``), from ``<data dir>/nltk_data`` or nltk's paths."""
    return _punkt(data_root(data_dir))


@lru_cache(maxsize=4)
def _punkt(root: Path | None) -> Callable[[str], list[str]]:
    import nltk
    from nltk.tokenize.punkt import PunktTokenizer

    saved = list(nltk.data.path)
    if root is not None:  # nltk reads model files only under its search path; the model is loaded eagerly
        nltk.data.path.insert(0, str(root / "nltk_data"))
    try:
        return PunktTokenizer("english").tokenize
    except LookupError:
        target = root / "nltk_data" if root else "<data dir>/nltk_data"
        raise FileNotFoundError(
            f"nltk's punkt sentence model (tokenizers/punkt_tab/english/) not found, needed by RULER's essay "
            f"haystack: run `python -m nltk.downloader -d {target} punkt_tab` (or install it in nltk's own data path)"
        ) from None
    finally:
        nltk.data.path[:] = saved
