"""Router training data: records → examples → tokens → packed rows; and a synthetic generator for quick runs.

Record formats (JSONL, one object per line, or parquet; a directory means all its ``*.jsonl`` / ``*.parquet``):
- plain: ``{"prompt": str, "answer": str, "category": str}``;
- official (``LCM-Lab/Elastic-Attention`` ``dataset_packing.py``): ``{"context": str, "question": str,
  "answer": str, "metadata": {"task": str, "is_prefix": bool}}``. The user turn is ``"\\n" + question`` and
  ``"\\n" + context`` joined by a newline, question first when ``is_prefix`` (the default); Summarization is
  wrapped as "You are given several news passages. Write a one-page summary of all news." … "\\n\\nSummary:", Code
  is prefixed with "Please complete the code given below.". The category is ``metadata["task"]``.

Design decisions:
- The prompt is one user turn through the tokenizer's chat template (Qwen3: ``enable_thinking=False``) with the
  generation prompt; the answer follows as the assistant turn, ended by the tokenizer's EOS token. The router sees
  exactly the prompt tokens it sees at inference.
- Every category must have a target: unknown categories are rejected, never mapped to a default.
- Samples longer than ``max_tokens`` lose the middle of their prompt (the first and last prompt tokens, which the
  router pools, are kept).
- Packing: samples sorted by length (longest first) go first-fit into rows of at most ``pack_tokens`` tokens; each
  row keeps its samples' boundaries (``cu_seqlens``), restarted positions, prompt lengths and categories.
- LM-loss targets: the answer tokens only (``loss_tokens="answer"``, the default: the loss then measures what
  routing costs the task) or every next token inside a sample (``"all"``, the official code's choice: only each
  sample's first token is not predicted).
"""

from __future__ import annotations

import ast
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

LossTokens = Literal["all", "answer"]

# Paper §4.1: the five task labels of the training mixture and their target ΩMSR (t_sen = 0.7, t_rob = 1.0), plus
# the two generic category names of the synthetic generator and the testbed.
DEFAULT_TARGETS: dict[str, float] = {
    "Single QA": 0.7,
    "MultiHop QA": 0.7,
    "Summarization": 1.0,
    "Code": 1.0,
    "In-Context Learning": 1.0,
    "sensitive": 0.7,
    "robust": 1.0,
}
SUMMARY_PREFIX = "You are given several news passages. Write a one-page summary of all news."
CODE_PREFIX = "Please complete the code given below."


@dataclass(frozen=True)
class Example:
    """One training example: the user prompt, the reference answer and its task category."""

    prompt: str
    answer: str
    category: str


@dataclass(frozen=True)
class TokenizedExample:
    """Token ids of prompt + answer, the prompt length and the category index."""

    input_ids: torch.Tensor  # [n] int64
    prompt_len: int
    category: int


@dataclass(frozen=True)
class PackedRow:
    """Samples packed into one row (batch 1, varlen).

    Attributes:
        input_ids: ``[T]`` token ids.
        targets: ``[T]`` next-token targets, ``-100`` where no loss is taken.
        position_ids: ``[T]`` positions restarting at 0 in each sample.
        cu_seqlens: ``[N + 1]`` int32 sample boundaries.
        prompt_lens: prompt length of each of the N samples.
        categories: ``[N]`` int64 category index of each sample.
    """

    input_ids: torch.Tensor
    targets: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    prompt_lens: list[int]
    categories: torch.Tensor

    @property
    def num_samples(self) -> int:
        return len(self.prompt_lens)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Records of a ``.jsonl`` or ``.parquet`` file, or of every such file in a directory (sorted by name)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"training data {path} does not exist")
    files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".parquet")) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"{path} holds no .jsonl or .parquet files")
    records: list[dict[str, Any]] = []
    for file in files:
        if file.suffix == ".parquet":
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise ValueError("reading parquet needs pyarrow: pip install 'elastic-bench[train]'") from None
            records.extend(pq.read_table(file).to_pylist())
        elif file.suffix == ".jsonl":
            with file.open() as handle:
                for number, line in enumerate(handle, 1):
                    if line.strip():
                        try:
                            records.append(json.loads(line))
                        except json.JSONDecodeError as err:
                            raise ValueError(f"{file}:{number}: not a JSON object ({err.msg})") from None
        else:
            raise ValueError(f"training data must be .jsonl or .parquet, got {file}")
    return records


def to_example(record: dict[str, Any], where: str = "record") -> Example:
    """Normalise a plain or official record (see the module docstring) to an `Example`."""
    if "prompt" in record:
        missing = [k for k in ("prompt", "answer", "category") if not isinstance(record.get(k), str)]
        if missing:
            raise ValueError(f"{where}: plain records need string fields prompt, answer, category; bad: {missing}")
        return Example(record["prompt"], record["answer"], record["category"])
    if "context" in record or "question" in record:
        meta = record.get("metadata") or {}
        if isinstance(meta, str):
            meta = ast.literal_eval(meta)
        task = meta.get("task")
        if not isinstance(task, str):
            raise ValueError(f"{where}: official records need metadata.task (the category)")
        context = "\n" + (record.get("context") or "").replace("\ufeff", "").rstrip()
        question = "\n" + (record.get("question") or "").replace("\ufeff", "").lstrip()
        user = question + "\n" + context if meta.get("is_prefix", True) else context + "\n" + question
        if task == "Summarization":
            user = SUMMARY_PREFIX + user + "\n\nSummary:"
        elif task == "Code":
            user = CODE_PREFIX + user
        return Example(user, (record.get("answer") or "").replace("\ufeff", ""), task)
    raise ValueError(f"{where}: expected fields prompt/answer/category or context/question/answer/metadata")


def load_examples(path: str | Path, targets: dict[str, float]) -> list[Example]:
    """Examples of the records at ``path``; every category must be a key of ``targets``."""
    examples = [to_example(r, f"{path} record {i + 1}") for i, r in enumerate(read_records(path))]
    check_categories(examples, targets)
    return examples


def check_categories(examples: Iterable[Example], targets: dict[str, float]) -> list[str]:
    """The categories present (in ``targets`` order); raises for a category without a target."""
    present = {e.category for e in examples}
    unknown = sorted(present - set(targets))
    if unknown:
        raise ValueError(
            f"categories {unknown} have no target ΩMSR; known: {sorted(targets)} (add --target NAME=VALUE)"
        )
    if not present:
        raise ValueError("no training examples")
    return [c for c in targets if c in present]


def tokenize(
    examples: list[Example], tokenizer, categories: list[str], max_tokens: int, progress: bool = False
) -> list[TokenizedExample]:
    """Token ids (chat template + answer + EOS) of each example, middle-truncated to ``max_tokens``."""
    from tqdm.auto import tqdm

    from elastic_bench.tasks.base import render

    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token to end answers with")
    index = {c: i for i, c in enumerate(categories)}
    out = []
    for ex in tqdm(examples, desc="tokenizing", disable=not progress, leave=False):
        prompt = render(tokenizer, ex.prompt)
        answer = tokenizer(ex.answer, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        excess = len(prompt) + len(answer) - max_tokens
        if excess > 0:
            if excess > len(prompt) - 2:
                raise ValueError(f"an answer of {len(answer)} tokens does not fit max_tokens={max_tokens}")
            head = (len(prompt) - excess) // 2
            prompt = prompt[:head] + prompt[head + excess :]
        ids = torch.tensor(prompt + answer, dtype=torch.int64)
        out.append(TokenizedExample(ids, len(prompt), index[ex.category]))
    return out


def pack(samples: list[TokenizedExample], pack_tokens: int, loss_tokens: LossTokens = "answer") -> list[PackedRow]:
    """First-fit-decreasing packing into rows of at most ``pack_tokens`` tokens (deterministic)."""
    if loss_tokens not in ("all", "answer"):
        raise ValueError(f"loss_tokens must be 'all' or 'answer', got {loss_tokens!r}")
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i].input_ids), i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = len(samples[i].input_ids)
        if n > pack_tokens:
            raise ValueError(f"a sample of {n} tokens exceeds pack_tokens={pack_tokens}; lower max_tokens")
        slot = next((b for b, free in enumerate(room) if free >= n), None)
        if slot is None:
            bins.append([])
            room.append(pack_tokens)
            slot = len(bins) - 1
        bins[slot].append(i)
        room[slot] -= n
    return [_row([samples[i] for i in members], loss_tokens) for members in bins]


def _row(members: list[TokenizedExample], loss_tokens: LossTokens) -> PackedRow:
    ids, targets, positions = [], [], []
    for s in members:
        n = len(s.input_ids)
        target = torch.full((n,), -100, dtype=torch.int64)
        target[:-1] = s.input_ids[1:]
        if loss_tokens == "answer":
            target[: s.prompt_len - 1] = -100
        ids.append(s.input_ids)
        targets.append(target)
        positions.append(torch.arange(n))
    lengths = torch.tensor([len(s.input_ids) for s in members])
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(torch.int32)
    return PackedRow(
        torch.cat(ids), torch.cat(targets), torch.cat(positions), cu,
        [s.prompt_len for s in members], torch.tensor([s.category for s in members], dtype=torch.int64),
    )


# ---- synthetic generator -------------------------------------------------------------------------------------------

_WORDS = (
    "river stone cloud amber forest lantern harbor meadow copper signal violet orbit canyon ember willow quartz "
    "saddle thistle marble falcon garden beacon pepper timber ripple summit velvet walnut"
).split()


def synthetic_records(num: int, length: int = 400, seed: int = 0) -> list[dict[str, str]]:
    """Plain records of two categories for quick runs and tests, about ``length`` characters of prompt each.

    - ``"sensitive"``: key–value retrieval; code lines are spread over the first half of a noise haystack and the
      question at the end asks for the code of one key (long-range attention matters).
    - ``"robust"``: continue a story written in capitals; the answer repeats the last sentence (local attention
      suffices).

    The two categories differ in their instructions and their alphabet, so even a tiny random model's pooled keys
    tell them apart.
    """
    rng = random.Random(seed)
    records = []
    for i in range(num):
        sentences, size = [], 0
        while size < length:
            sentence = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 8))) + "."
            sentences.append(sentence)
            size += len(sentence) + 1
        if i % 2 == 0:
            keys = rng.sample(_WORDS, 3)
            codes = [str(rng.randint(1000, 9999)) for _ in keys]
            for key, code in zip(keys, codes):
                sentences.insert(rng.randrange(len(sentences) // 2 + 1), f"The code of {key} is {code}.")
            k = rng.randrange(len(keys))
            prompt = "Find the code. " + " ".join(sentences) + f" Question: what is the code of {keys[k]}?"
            records.append({"prompt": prompt, "answer": codes[k], "category": "sensitive"})
        else:
            sentences = [s.upper() for s in sentences]
            prompt = "CONTINUE THE STORY. " + " ".join(sentences) + " REPEAT THE LAST SENTENCE."
            records.append({"prompt": prompt, "answer": sentences[-1], "category": "robust"})
    return records
