"""code_completion: LongBench lcc's prompt and scorer over the installed torch package's Python source; samples fit
their length for tiny:qwen3's tokenizer, are seeded, and ask for the true next line of a torch file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from elastic_bench import tasks
from elastic_bench.modeling.loading import byte_tokenizer
from elastic_bench.tasks.code_completion import is_test, string_lines, torch_corpus
from elastic_bench.tasks.longbench import official_config


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()  # tiny:qwen3's tokenizer


def _torch_file(path: str) -> list[str]:
    root = Path(importlib.util.find_spec("torch").submodule_search_locations[0]).parent
    return (root / path).read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("length", [1024, 2048])
def test_samples_fit_the_length_are_seeded_and_ask_for_the_next_line_of_a_torch_file(tok, length):
    task = tasks.get("code_completion")
    samples = task.samples(tok, length, limit=4, seed=3)
    assert len({tuple(s.input_ids) for s in samples}) == 4
    prompt, budget = (table["lcc"] for table in official_config())
    head, tail = prompt.split("{context}")
    corpus = torch_corpus()
    for sample in samples:
        assert sample.max_new_tokens == budget == 64
        assert 0.9 * length <= len(sample.input_ids) + sample.max_new_tokens <= length
        meta = sample.metadata
        assert meta["category"] == "robust" and meta["length"] == length
        assert meta["corpus"] == corpus.name and corpus.name.startswith("torch-") and len(meta["corpus_digest"]) == 12
        text = tok.decode(sample.input_ids)  # no chat template: the plain LongBench prompt
        assert text.startswith(head) and text.endswith(tail)
        lines = _torch_file(meta["file"])
        answer = lines[meta["line"] - 1]
        assert sample.references == [answer.rstrip()] and answer.strip() and not answer.lstrip().startswith("#")
        assert meta["line"] not in string_lines("\n".join(lines))  # code, not a docstring's text
        above = lines[max(0, meta["line"] - 1 - meta["context_lines"]) : meta["line"] - 1]
        assert text.removesuffix(tail).endswith("\n".join(line.rstrip() for line in above) + "\n")
        assert not is_test(meta["file"]) and meta["file"].startswith("torch/")
    again = tasks.get("code_completion").samples(tok, length, limit=4, seed=3)
    assert [(s.input_ids, s.references, s.metadata) for s in again] == [
        (s.input_ids, s.references, s.metadata) for s in samples]
    assert task.samples(tok, length, limit=1, seed=4)[0].input_ids != samples[0].input_ids


def test_lcc_scoring_and_a_length_too_short(tok):
    task = tasks.get("code_completion")
    sample = task.samples(tok, 1024, limit=1, seed=3)[0]
    gold = sample.references[0]
    assert task.score(gold, sample) == 1.0
    assert task.score(f"```python\n# the next line\n{gold}\n", sample) == 1.0  # lcc: the first line without a comment
    assert task.score("zzzz qqqq wwww", sample) < 0.5
    assert task.aggregate([{"score": 1.0, "metadata": {}}, {"score": 0.5, "metadata": {}}]) == {"score": 75.0}
    with pytest.raises(tasks.LengthTooShortError, match="code_completion: a target length of 64 tokens"):
        task.samples(tok, 64, limit=1)


def test_the_corpus_leaves_out_tests_and_the_mixed_suite_group():
    source = 'def f():\n    """Doc\n    more."""\n    x = f"""a\nb"""\n    return x  # """\n'
    assert string_lines(source) == {2, 3, 5} and string_lines("def (") == frozenset()
    assert is_test("torch/testing/_internal/common_utils.py") and is_test("torch/nn/test_x.py")
    assert not is_test("torch/_dynamo/testing.py")
    corpus = torch_corpus()
    assert corpus.paths == tuple(sorted(corpus.paths)) and not any(map(is_test, corpus.paths))
    assert all(len(line) <= 200 for line in corpus.lines[:: 997])
    assert tasks.expand(["mixed_suite"]) == ["ruler_niah_single_1", "ruler_vt", "code_completion"]
    from elastic_bench.tasks import catalog

    assert catalog.benchmark_of("code_completion").name == "Code completion"
