"""``elastic-bench records``: the router's training set for a model, made from its tokenizer and context alone (its
weights are not loaded); ``train-router --data FILE`` trains on it.

The tasks, their categories and the records are `elastic_bench.training.make_records`'; this module adds what needs
the model side, which the training side may not import: the model's tokenizer and positions
(`elastic_bench.modeling.loading`).
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic_bench.foundation.files import check_writable, write_jsonl
from elastic_bench.foundation.options import check_at_least, check_file_output, check_lengths
from elastic_bench.foundation.registry import did_you_mean
from elastic_bench.training.make_records import DEFAULT_TASKS, default_lengths, make_task, router_records, task_names
from elastic_bench.training.record_text import CATEGORIES, CorpusText, GeneratedText


@dataclass
class RecordsConfig:
    """What ``elastic-bench records`` writes.

    Attributes:
        model: the model whose tokenizer measures the records and whose positions bound their lengths: tiny:qwen3,
            tiny:llama, testbed, a local model folder, a GGUF file (or a folder holding one) or a hub id; its weights
            are not loaded.
        output: the JSON Lines file `write_router_records` writes (atomically; plain records with category, task,
            label, identities, length and tokens).
        lengths: record lengths in tokens, the prompt through the chat template plus the answer (e.g. 2K,8K); none:
            powers of two from min_length up to the model's positions capped at max_length, that top included.
        min_length: the shortest of the default lengths.
        max_length: the cap on the default lengths.
        samples: records per category (sensitive, robust) and length, cycling over the category's tasks.
        tasks: the tasks to draw from (docs/records.md lists them); none: single_qa, multihop_qa, summary, code and
            icl, the paper's five labels from sources no benchmark uses.
        corpus: a text file, or a folder of .txt files, that the haystacks and passages come from; none: generated
            reports.
        data_dir: folder holding nltk's punkt model (nltk_data/, to split a corpus into sentences) and RULER's cwe word
            list; none: $ELASTIC_BENCH_DATA.
        seed: the records' seed: the same seed and model write the same file.
        progress: show a progress bar.
    """

    model: str = "tiny:qwen3"
    output: str = "records.jsonl"
    lengths: list[int] | None = None
    min_length: int = 1024
    max_length: int = 32768
    samples: int = 32
    tasks: list[str] | None = None
    corpus: str | None = None
    data_dir: str | None = None
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        if self.lengths is not None:
            check_lengths("--lengths", self.lengths)
        check_at_least("--min-length", self.min_length, 1)
        check_at_least("--max-length", self.max_length, self.min_length)
        check_at_least("--samples", self.samples, 1)
        check_at_least("--seed", self.seed, 0)
        known = task_names()
        for name in self.tasks or ():
            if name not in known:
                raise did_you_mean("record task", name, list(known))
        if self.tasks is not None and not self.tasks:
            raise ValueError("--tasks must name at least one task")


def write_router_records(config: RecordsConfig) -> int:
    """Write the records ``config`` asks for and return how many; says which lengths, text and tasks it chose.

    Raises:
        ValueError: a length exceeds the model's positions, or none of a category's tasks fits it.
        FileNotFoundError: the corpus, or the punkt model that splits it, is missing.
    """
    check_file_output(config.output)
    check_writable(config.output)  # a folder that refuses the file, found before the records are made
    records = make_router_records(config)
    write_jsonl(config.output, records)
    print(f"{len(records)} records written to {config.output}")
    return len(records)


def make_router_records(config: RecordsConfig, tokenizer=None) -> list[dict]:
    """The records ``config`` asks for, measured with ``config.model``'s ``tokenizer`` (None: loaded here, after the
    lengths and the corpus are checked; ``config.output`` is not written); says which lengths, text and tasks it
    chose, and which tasks a length left out.

    Raises:
        ValueError: a length exceeds the model's positions, or none of a category's tasks fits it.
        FileNotFoundError: the corpus, or the punkt model that splits it, is missing.
    """
    from tqdm.auto import tqdm

    from elastic_bench.modeling.loading import load_tokenizer, max_positions

    text = CorpusText(config.corpus, config.data_dir) if config.corpus else GeneratedText()
    names = config.tasks or list(DEFAULT_TASKS)
    tasks = [make_task(name, text, config.data_dir) for name in names]
    positions = max_positions(config.model)
    lengths = config.lengths or default_lengths(positions, config.min_length, config.max_length)
    beyond = [length for length in lengths if length > positions]
    if beyond:
        raise ValueError(f"--lengths {','.join(map(str, beyond))} exceed the {positions} positions of {config.model}")
    if tokenizer is None:
        tokenizer = load_tokenizer(config.model)
    categories = [category for category in CATEGORIES if any(task.category == category for task in tasks)]
    print(f"records for {config.model}: lengths {','.join(map(str, lengths))}, {config.samples} per category "
          f"({', '.join(categories)}) and length, from {text.description}; tasks: {', '.join(names)}")
    left_out: list[tuple[str, int, int | None]] = []
    stream = router_records(tokenizer, lengths, config.samples, tasks, config.seed, left_out)
    total = len(lengths) * config.samples * len(categories)
    records = list(tqdm(stream, total=total, desc="records", disable=not config.progress))
    if left_out:
        print("left out where their smallest record is longer than the length: "
              + ", ".join(f"{name} at {length} ({'too short for it' if tokens is None else f'{tokens} tokens'})"
                        for name, length, tokens in left_out))
    return records
