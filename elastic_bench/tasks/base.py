"""The task interface: raw records → tokenised samples for a tokenizer and target length; prediction → score.

Tasks know nothing of attention. A task is a class registered by name; groups name several tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from elastic_bench.foundation.registry import Registry, did_you_mean

from .corpora import Source


@dataclass
class Sample:
    """One model input and what scoring needs.

    Attributes:
        id: stable identifier within the task (used to resume a cell).
        input_ids: the exact tokens fed to the model (chat template applied where the task says so).
        max_new_tokens: generation budget.
        references: gold answers.
        metadata: task-specific fields for scoring and aggregation (length bucket, classes, difficulty, ...).
        stop_token_ids: extra token ids that end generation besides the tokenizer's EOS.
        min_new_tokens: generation cannot stop before this many tokens.
    """

    id: str
    input_ids: list[int]
    max_new_tokens: int
    references: list[str]
    metadata: dict[str, Any] = field(default_factory=dict)
    stop_token_ids: list[int] = field(default_factory=list)
    min_new_tokens: int = 0


class Task:
    """Base class of a registered task.

    Args:
        data_dir: local directory of external corpora (see `corpora`); None falls back to ``$ELASTIC_BENCH_DATA``.

    Attributes:
        sources: the corpus files `samples` reads (`elastic_bench.tasks.corpora.Source`: where under the data
            directory, what hub fallback); empty for a task generated offline. ``elastic-bench tasks`` lists them.
        identities: what the task's questions and answers come from, as strings shared by everything drawn from the
            same source: ``generator:<family>.<name>`` for a generator (``generator:ruler.niah``), ``dataset:<name>``
            for a dataset whose records give its questions, answers or documents (``dataset:hotpotqa``, the same for
            LongBench's hotpotqa and RULER's qa_2). Text that only pads a haystack (RULER's essays, the testbed's
            noise) is not one. A router or gate file trained on data of one of these identities is
            *in-distribution* for the task (`elastic_bench.training.provenance`): ``run`` refuses to score it
            without ``--allow-in-distribution``.
    """

    name: str = ""
    sources: tuple[Source, ...] = ()
    identities: frozenset[str] = frozenset()
    score_range: tuple[float, float] = (0.0, 1.0)
    """Where every per-sample score of `score` lies."""

    def __init__(self, data_dir: str | None = None):
        self.data_dir = data_dir

    def samples(self, tokenizer, length: int, limit: int | None = None, seed: int = 42) -> list[Sample]:
        """Samples fitted to ``length`` tokens (prompt plus generation budget) for ``tokenizer``."""
        raise NotImplementedError

    def score(self, prediction: str, sample: Sample) -> float:
        """Official per-sample score of ``prediction``, in [0, 1]."""
        raise NotImplementedError

    def rescore(self, record: dict[str, Any]) -> float:
        """`score` computed again for a prediction record (a line of a cell's ``predictions.jsonl``: its
        ``prediction``, ``references`` and ``metadata``): a stored score is checked against it, never read back.

        Raises:
            ValueError: the prediction is not a string, the references not a list of strings or the metadata not a
                JSON object.
        """
        prediction, references, metadata = (record.get(k) for k in ("prediction", "references", "metadata"))
        if not isinstance(prediction, str):
            raise ValueError("its prediction is not a string")
        if not isinstance(references, list) or not all(isinstance(r, str) for r in references):
            raise ValueError("its references are not a list of strings")
        if not isinstance(metadata, dict):
            raise ValueError("its metadata is not a JSON object")
        return self.score(prediction, Sample(str(record.get("id")), [], 0, references, metadata))

    def follow_up(self, sample: Sample, prediction: str, tokenizer) -> Sample | None:
        """A second turn built from the first ``prediction`` (LongBench-v2 chain of thought), or None; when given,
        the runner generates it and scores that second prediction."""
        return None

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, float]:
        """Official aggregation of scored records (``{"score": float, "metadata": dict}``): ``{"score": mean×100}``
        rounded to 2 decimals by default; tasks override for buckets and breakdowns."""
        scores = [r["score"] for r in records]
        return {"score": round(100 * sum(scores) / len(scores), 2) if scores else float("nan")}


class LengthTooShortError(ValueError):
    """A target length below the shortest input a task can build with the tokenizer (the message names that
    minimum)."""


REGISTRY: Registry[type[Task]] = Registry("task", entry_points="elastic_bench.tasks")
GROUPS: dict[str, list[str]] = {}


def register(name: str, group: str | None = None):
    """Class decorator: register a `Task` under ``name`` (and add it to ``group``)."""

    def decorator(cls: type[Task]) -> type[Task]:
        cls.name = name
        REGISTRY.add(name, cls)
        if group:
            GROUPS.setdefault(group, []).append(name)
        return cls

    return decorator


def get(name: str, data_dir: str | None = None) -> Task:
    """The task registered as ``name``, reading external corpora from ``data_dir`` (see `corpora`)."""
    return REGISTRY.get(name)(data_dir=data_dir)


def names() -> list[str]:
    """Registered task names."""
    return REGISTRY.names()


def groups() -> dict[str, list[str]]:
    """Group name → its task names (the plugins' groups included)."""
    REGISTRY.names()
    return GROUPS


def expand(specs: list[str]) -> list[str]:
    """Task names for a list of task and group names, in order, without duplicates; unknown names raise."""
    result: list[str] = []
    valid = REGISTRY.names()  # discovers the plugins' tasks and groups
    for spec in specs:
        if spec in GROUPS:
            members = GROUPS[spec]
        elif spec in REGISTRY:
            members = [spec]
        else:
            raise did_you_mean("task", spec, sorted([*valid, *GROUPS]))
        result.extend(m for m in members if m not in result)
    return result


def check_length(names: list[str], tokenizer, length: int, data_dir: str | None = None, seed: int = 42) -> None:
    """Refuse ``length`` when a task of ``names`` cannot fit one input into it with ``tokenizer``: what a run checks for
    its shortest length once the tokenizer is loaded, before the model's weights. The other errors a task raises
    here (a missing corpus, a malformed record) are left to its cells, which record them.

    Raises:
        LengthTooShortError: from the first task that cannot fit ``length`` (naming its minimum).
    """
    for name in names:
        try:
            get(name, data_dir).samples(tokenizer, length, 1, seed)
        except LengthTooShortError:
            raise
        except (ValueError, FileNotFoundError, KeyError):
            continue


def render(tokenizer, user: str, answer_prefix: str = "", chat: bool | None = None) -> list[int]:
    """Tokens of one user turn plus an assistant prefix the model continues.

    With ``chat`` (default: whether the tokenizer has a chat template) the tokenizer's chat template wraps the user
    turn and the prefix starts the assistant message (``continue_final_message``); otherwise the plain text
    ``user + answer_prefix`` is tokenised with the tokenizer's default special tokens.
    """
    chat = bool(getattr(tokenizer, "chat_template", None)) if chat is None else chat
    if not chat:
        return tokenizer(user + answer_prefix).input_ids
    messages = [{"role": "user", "content": user}]
    if answer_prefix:
        messages.append({"role": "assistant", "content": answer_prefix})
    text = tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=not answer_prefix,
        continue_final_message=bool(answer_prefix),
        enable_thinking=False,  # Qwen3: answer directly, as the paper's evaluation does; ignored by other templates
    )
    return tokenizer(text, add_special_tokens=False).input_ids
