"""The testbed: vocabulary and tokenizer, task generators, registered tasks, router records, fast evaluation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from elastic_bench import tasks
from elastic_bench.kernels import StreamingGeometry
from elastic_bench.testbed import text
from elastic_bench.testbed.generators import MAX_NEW_TOKENS, RECENT_SENTENCES, SPECS, Generator, sample_rng
from elastic_bench.testbed.training.evaluate import exact_match, window_mask
from elastic_bench.testbed.training.records import records
from elastic_bench.testbed.vocab import build

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def vocab():
    return build()


@pytest.fixture(scope="module")
def tokenizer(vocab):
    return vocab.tokenizer()


def test_vocabulary_is_word_level_with_pseudo_word_keys(vocab):
    assert 4000 < len(vocab) < 4600
    keys = text.keys()
    assert len(set(keys)) == text.NUM_KEYS
    assert all(2 <= len(k) // 2 <= 3 and len(k) % 2 == 0 for k in keys)  # 2-3 consonant-vowel syllables
    assert not set(keys) & (set(text.NOUNS) | set(text.ADJECTIVES) | set(text.VERBS) | set(text.template_words()))
    for value, pieces in ((1034567, ["10", "##34", "##56", "##7"]), (12, ["12"]), (5, ["5"]), (100, ["10", "##0"])):
        assert [vocab.tokens[i] for i in vocab.number(value)] == pieces
        assert vocab.decode(vocab.number(value)) == str(value)
        assert vocab.encode(str(value)).tolist() == vocab.number(value).tolist()  # the tokenizer splits it so too


@pytest.mark.parametrize("task", list(SPECS))
def test_prompts_round_trip_through_the_saved_tokenizer(vocab, tokenizer, tmp_path, task):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert not getattr(loaded, "chat_template", None)
    example = Generator(vocab).example(SPECS[task], sample_rng(0, task, 0), 1024)
    prompt_text = vocab.decode(example.user) + " " + vocab.decode(example.prefix)
    assert loaded(prompt_text).input_ids == example.prompt_ids(vocab).tolist()
    answer = loaded.decode(example.answer.tolist() + [vocab.eos_id], skip_special_tokens=True)
    assert answer == example.reference(vocab) + "."


@pytest.mark.parametrize("length", [256, 1024, 4096])
@pytest.mark.parametrize("task", list(SPECS))
def test_examples_fill_the_length_exactly(vocab, task, length):
    generator = Generator(vocab)
    example = generator.example(SPECS[task], sample_rng(0, task, 1), length)
    assert len(example.prompt_ids(vocab)) + MAX_NEW_TOKENS == length
    ids, weights = generator.example(SPECS[task], sample_rng(0, task, 1), length, training=True).training_sequence(
        vocab
    )
    assert len(ids) == len(weights) == length
    assert ids[0] == vocab.bos_id and ids[-1] == vocab.eos_id and weights[-1] == 1.0


def test_needles_answers_and_family_layout(vocab):
    generator = Generator(vocab)
    for index in range(20):
        multikey = generator.example(SPECS["niah_multikey"], sample_rng(0, "niah_multikey", index), 2048)
        context = vocab.decode(multikey.context)
        key = vocab.tokens[multikey.prefix[5]]  # "The special magic number for KEY ..."
        value = multikey.reference(vocab)
        assert f"numbers for {key} is {value}." in context
        assert context.count("One of the special magic numbers for") == 4
        assert context.count(f" {key} ") == 1  # the three distractors have other keys

        recent = generator.example(SPECS["niah_recent"], sample_rng(0, "niah_recent", index), 4096)
        needle = vocab.encode(f"for {vocab.tokens[recent.prefix[5]]} is")
        where = [i for i in range(len(recent.context)) if np.array_equal(recent.context[i : i + 3], needle)]
        assert len(where) == 1 and len(recent.context) - where[0] <= 5 * RECENT_SENTENCES + 4 * 20

        repeat = generator.example(SPECS["repeat"], sample_rng(0, "repeat", index), 1024)
        assert np.array_equal(repeat.context[-len(repeat.answer) :], repeat.answer)
        words = set(text.NOUNS) | set(text.ADJECTIVES) | set(text.VERBS)  # haystack words, never keys
        assert len(repeat.answer) == 7 and {vocab.tokens[i] for i in repeat.answer[:-1]} <= words


def test_followups_query_the_distractors_in_training_only(vocab):
    generator = Generator(vocab)
    spec = SPECS["niah_multikey"]
    train = generator.example(spec, sample_rng(0, "niah_multikey", 3), 1024, training=True)
    evaluation = generator.example(spec, sample_rng(0, "niah_multikey", 3), 1024)
    assert len(train.followups) == 3 and evaluation.followups == []
    context = vocab.decode(train.context)
    for asked, answer in train.followups:
        key = vocab.tokens[asked[np.flatnonzero(np.isin(asked, vocab.key_ids))[0]]]
        assert f"numbers for {key} is {vocab.decode(answer)}" in context
    ids, weights = train.training_sequence(vocab)
    text_end = 1 + len(train.instruction) + len(train.context)
    assert weights[:text_end].sum() == 0
    assert (weights == 1.0).sum() == 4 * (len(train.answer) + 1)
    _, lm_weights = train.training_sequence(vocab, context_weight=0.02)  # a light LM loss on the text alone
    assert lm_weights[0] == 0 and np.all(lm_weights[1:text_end] == np.float32(0.02))
    assert np.array_equal(lm_weights[text_end:], weights[text_end:])


def test_same_seed_same_sample_other_seed_other_sample(vocab):
    generator = Generator(vocab)
    a, b, c = (generator.example(SPECS["niah_single"], sample_rng(s, "niah_single", 0), 1024) for s in (5, 5, 6))
    assert np.array_equal(a.prompt_ids(vocab), b.prompt_ids(vocab))
    assert not np.array_equal(a.prompt_ids(vocab), c.prompt_ids(vocab))


def test_registered_tasks_fit_any_tokenizer_and_score_like_ruler(tokenizer):
    from elastic_bench.modeling.loading import byte_tokenizer

    assert tasks.expand(["testbed"]) == [f"testbed_{n}" for n in SPECS]
    assert set(tasks.expand(["testbed_sensitive"])) == {"testbed_niah_single", "testbed_niah_multikey"}
    for name in tasks.expand(["testbed"]):
        task = tasks.get(name)
        exact = task.samples(tokenizer, 1024, limit=2)
        assert all(len(s.input_ids) + s.max_new_tokens == 1024 for s in exact)
        assert exact[0].metadata["category"] == SPECS[name.removeprefix("testbed_")].category
        byte_level = task.samples(byte_tokenizer(), 2048, limit=2)
        assert all(1900 < len(s.input_ids) + s.max_new_tokens <= 2048 for s in byte_level)
        sample = exact[0]
        assert task.score(f"{sample.references[0]}.", sample) == 1.0
        assert task.score("0000000", sample) == 0.0
    with pytest.raises(ValueError, match="too short"):
        tasks.get("testbed_niah_multikey").samples(tokenizer, 120, limit=1)


def test_router_records_are_family_labelled_and_tokenise_to_the_trained_prompt(vocab, tokenizer):
    rows = list(records([1024], samples=2, seed=1))
    assert len(rows) == 2 * len(SPECS)
    assert {r["category"] for r in rows} == {"sensitive", "robust"}
    assert all(set(r) == {"prompt", "answer", "category", "task", "identities"} for r in rows)
    assert all(r["identities"] == sorted(tasks.REGISTRY.get(r["task"]).identities) for r in rows)
    evaluation_prompts = {tuple(s.input_ids) for s in tasks.get("testbed_niah_single").samples(tokenizer, 1024, 2)}
    for row in rows:
        ids = tokenizer(row["prompt"]).input_ids
        assert len(ids) + MAX_NEW_TOKENS == 1024 and ids[0] == vocab.bos_id
        assert tuple(ids) not in evaluation_prompts
        answer = tokenizer(row["answer"], add_special_tokens=False).input_ids
        assert tokenizer.decode(ids + answer, skip_special_tokens=True) == row["prompt"] + " " + row["answer"]
    # the family marker: the instruction opens the prompt, the question closes it
    def words(ids):  # keys masked: they are random
        return tuple(-1 if i in set(vocab.key_ids.tolist()) else i for i in ids)

    first = {r["task"]: words(tokenizer(r["prompt"]).input_ids[:20]) for r in rows}
    last = {r["task"]: words(tokenizer(r["prompt"]).input_ids[-12:]) for r in rows}
    assert len(set(first.values())) == len(SPECS) and len(set(last.values())) == 3  # niah_single/multikey share it


def _tiny_llama(vocab):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def test_window_mask_is_the_streaming_method(vocab):
    from elastic_bench import apply, get_method

    model = _tiny_llama(vocab)
    ids = torch.randint(10, len(vocab), (2, 400))
    geometry = StreamingGeometry(16, 64)
    with torch.no_grad():
        masked = model(ids, attention_mask=window_mask(400, geometry, "cpu")).logits
        with apply(get_method("streaming", sink=16, local=64), model, backend="reference"):
            method = model(ids).logits
        full = model(ids).logits
    torch.testing.assert_close(masked, method, atol=1e-5, rtol=1e-5)
    assert (masked - full)[:, 100:].abs().max() > 1e-3


def test_window_mask_with_prompt_ends_streams_the_prompt_and_decodes_densely():
    geometry = StreamingGeometry(4, 8)
    plain = window_mask(40, geometry, "cpu")
    mask = window_mask(40, geometry, "cpu", torch.tensor([20, 40]))
    causal = torch.ones(40, 40, dtype=torch.bool).tril()
    assert mask.shape == (2, 1, 40, 40) and torch.equal(mask[1, 0], plain[0, 0])
    assert torch.equal(mask[0, 0, :20], plain[0, 0, :20]) and torch.equal(mask[0, 0, 20:], causal[20:])
    assert not plain[0, 0, 30, 10] and mask[0, 0, 30, 10]


class _Oracle(torch.nn.Module):
    """Predicts the next token by looking ahead (``wrong_last``: gets the last token of every row wrong)."""

    def __init__(self, vocab_size: int, wrong_last: bool = False):
        super().__init__()
        self.vocab_size, self.wrong_last = vocab_size, wrong_last
        self.lm_head = torch.nn.Identity()
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def model(self, input_ids, attention_mask=None):
        nxt = torch.roll(input_ids, -1, dims=1)
        lengths = (input_ids != 0).sum(1)  # right-padded with <pad> = 0
        if self.wrong_last:
            nxt[torch.arange(len(nxt)), lengths - 2] = 1
        return type("Out", (), {"last_hidden_state": torch.nn.functional.one_hot(nxt, self.vocab_size).float()})


def test_exact_match_counts_a_sample_only_when_every_answer_token_and_eos_match(vocab):
    perfect = exact_match(_Oracle(len(vocab)), vocab, [512], num_samples=3, batch_tokens=1024)
    assert set(perfect) == {f"testbed_{n}" for n in SPECS}
    assert all(v == {"512": 100.0} for v in perfect.values())
    assert all(v == {"512": 0.0} for v in exact_match(_Oracle(len(vocab), True), vocab, [512], 3).values())


def test_testbed_data_command(tmp_path, capsys):
    from elastic_bench import cli

    out = tmp_path / "records.jsonl"
    assert cli.main(["testbed", "data", "--output", str(out), "--samples", "1", "--lengths", "512"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(SPECS)
    assert cli.main(["testbed", "data", "--output", str(out), "--samples", "0"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_key_matching_probe_finds_the_shipped_models_matching_heads(vocab):
    from transformers import LlamaForCausalLM

    from elastic_bench.modeling.loading import TESTBED_DIR
    from elastic_bench.testbed.training.heads import best_head, key_matching
    from elastic_bench.testbed.training.train import model_config

    shipped = LlamaForCausalLM.from_pretrained(TESTBED_DIR, dtype=torch.float32)
    selectivity = key_matching(shipped, vocab, length=512, samples=2)
    assert selectivity.shape == (6, 8) and shipped.config._attn_implementation == "sdpa"  # restored
    best = best_head(selectivity)
    assert (best["layer"], best["head"]) in {(3, 1), (3, 3)} and best["selectivity"] > 0.8
    torch.manual_seed(0)
    untrained = LlamaForCausalLM(model_config(vocab))
    assert key_matching(untrained, vocab, length=512, samples=2).max() < 0.2
