"""The testbed training loop at toy scale on the CPU: schedule, determinism, resume, export."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from elastic_bench.testbed.generators import SPECS
from elastic_bench.testbed.training.train import (
    Batches,
    TestbedTrainConfig,
    attention_aux_loss,
    learning_rate,
    model_config,
    train,
)
from elastic_bench.testbed.vocab import build
from elastic_bench.training.engine import RunOptions

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.parametrize("tasks", ["all", "robust"])
def test_curriculum_then_mixture_and_streaming_steps_of_the_chosen_tasks(tasks):
    config = TestbedTrainConfig(steps=1000, batch_tokens=4096, streaming_fraction=0.5, stage_fraction=0.04,
                         streaming_tasks=tasks)
    batches = Batches(config, build())
    rng = np.random.default_rng(0)
    assert [batches.length_at(s, rng) for s in (0, 39, 40, 80, 120, 160)] == [256, 256, 512, 1024, 2048, 4096]
    assert {batches.length_at(s, rng) for s in range(200, 400)} == {1024, 2048, 4096}
    streaming = [s for s in range(200, 260) if batches[s]["streaming"]]
    assert streaming and not any(batches[s]["streaming"] for s in range(0, 200, 7))
    vocab = build()
    seen = set().union(*({vocab.tokens[row[1]] for row in batches[step]["ids"]} for step in streaming))
    robust_instructions = {SPECS[t].instruction.split()[0] for t in SPECS if SPECS[t].category == "robust"}
    assert seen <= robust_instructions if tasks == "robust" else seen > robust_instructions
    with pytest.raises(ValueError, match="streaming_tasks"):
        TestbedTrainConfig(streaming_tasks="sensitive")
    assert learning_rate(config, 0) < learning_rate(config, 19) == pytest.approx(config.lr)
    assert learning_rate(config, 999) == pytest.approx(config.lr * config.min_lr_ratio, rel=1e-3)


def test_curriculum_task_weights_apply_during_the_curriculum_only():
    vocab = build()
    config = TestbedTrainConfig(steps=1000, batch_tokens=4096, streaming_fraction=0.0, stage_fraction=0.04)
    assert config.curriculum_task_weights == {"niah_multikey": 1.0}  # the shipped recipe
    batches = Batches(config, vocab)
    assert config.curriculum_steps == 200
    multikey = SPECS["niah_multikey"].instruction.split()[0]  # "Some"
    first_words = [{vocab.tokens[row[1]] for row in batches[s]["ids"]} for s in (0, 45, 199, *range(200, 230))]
    assert all(words == {multikey} for words in first_words[:3])
    assert set().union(*first_words[3:]) > {multikey}  # after the curriculum: the whole mixture
    with pytest.raises(ValueError, match="unknown testbed tasks"):
        TestbedTrainConfig(curriculum_task_weights={"niah_nothing": 1.0})
    with pytest.raises(ValueError, match="mix weights"):
        TestbedTrainConfig(mix_weights=(0.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="first_token_weight > 0"):
        TestbedTrainConfig(first_token_weight=0.0)
    with pytest.raises(ValueError, match="context_weight"):
        TestbedTrainConfig(context_weight=1.0)
    with pytest.raises(ValueError, match="streaming_fraction"):
        TestbedTrainConfig(streaming_fraction=1.5)


def test_training_runs_with_deterministic_kernels_and_restores_the_setting(tmp_path, monkeypatch):
    from elastic_bench.testbed.training import train as train_module

    seen = []
    monkeypatch.setattr(train_module, "_train", lambda *a: seen.append(torch.are_deterministic_algorithms_enabled()))
    before = torch.are_deterministic_algorithms_enabled()
    train(TestbedTrainConfig(**TOY), run(tmp_path / "a"))
    train(TestbedTrainConfig(**(TOY | {"deterministic": False})), run(tmp_path / "b"))
    assert seen == [True, False] and torch.are_deterministic_algorithms_enabled() == before

    def no_deterministic_kernel(*args):
        raise RuntimeError("index_add_cuda_ does not have a deterministic implementation, but you set ...")

    monkeypatch.setattr(train_module, "_train", no_deterministic_kernel)
    with pytest.raises(NotImplementedError, match="--no-deterministic"):
        train(TestbedTrainConfig(**TOY), run(tmp_path / "c"))
    assert torch.are_deterministic_algorithms_enabled() == before


def test_rope_theta_reaches_the_exported_model(tmp_path):
    from elastic_bench.modeling.loading import load_model

    train(TestbedTrainConfig(**(TOY | {"rope_theta": 5e5, "eval_samples": 0})), run(tmp_path))
    model, _ = load_model(str(tmp_path), dtype=torch.float32, device="cpu")
    assert model.config.rope_parameters["rope_theta"] == 5e5


def test_batches_are_a_function_of_seed_and_step():
    vocab = build()
    a, b = Batches(TestbedTrainConfig(seed=3), vocab), Batches(TestbedTrainConfig(seed=4), vocab)
    first, again, other = a[500], Batches(TestbedTrainConfig(seed=3), vocab)[500], b[500]
    assert np.array_equal(first["ids"], again["ids"]) and not np.array_equal(first["ids"][0], other["ids"][0])
    rows, cols = np.divmod(first["positions"], first["ids"].shape[1])
    assert np.array_equal(first["ids"][rows, cols + 1], first["targets"])  # position t predicts token t+1
    assert first["answer"].sum() > 0 and np.all(first["weights"][first["answer"]] == 1.0)


def test_batches_mark_each_answers_first_token_and_task():
    vocab = build()
    batch = Batches(TestbedTrainConfig(seed=3), vocab)[3000]  # after the curriculum: every task in the batch
    rows = batch["positions"] // batch["ids"].shape[1]
    for index, name in enumerate(SPECS):
        mine = batch["task"] == index
        sequences = len(np.unique(rows[mine]))
        answers = 1 + 3 * SPECS[name].followups  # multi-key sequences also ask for their three distractors
        assert sequences > 0 and int((mine & batch["first"]).sum()) == sequences * answers
    single = batch["first"] & (batch["task"] == list(SPECS).index("niah_single"))
    assert np.isin(batch["targets"][single], vocab.number_ids).all()  # a needle answer opens with its first pair
    weighted = Batches(TestbedTrainConfig(seed=3, first_token_weight=4.0), vocab)[3000]
    assert np.array_equal(weighted["targets"], batch["targets"])
    assert np.all(weighted["weights"][batch["first"]] == 4.0)
    assert np.array_equal(weighted["weights"][~batch["first"]], batch["weights"][~batch["first"]])
    # every text token scored, answers as before
    lm = Batches(TestbedTrainConfig(seed=3, context_weight=0.02), vocab)[3000]
    assert np.array_equal(lm["ids"], batch["ids"]) and len(lm["positions"]) > 10 * len(batch["positions"])
    kept = np.isin(lm["positions"], batch["positions"])
    assert np.array_equal(lm["weights"][kept], batch["weights"]) and np.all(lm["weights"][~kept] == np.float32(0.02))
    assert lm["answer"].sum() == batch["answer"].sum()


def test_curriculum_needles_add_distractors_but_keep_four_questions():
    vocab = build()
    config = TestbedTrainConfig(seed=3, curriculum_needles=16)
    step = 2 * round(config.stage_fraction * config.steps)  # the 1K stage, multi-key only
    many, usual = Batches(config, vocab)[step], Batches(TestbedTrainConfig(seed=3), vocab)[step]
    needle = vocab.encode("magic numbers for")
    for batch, count in ((many, 16), (usual, 4)):
        ids = batch["ids"]
        assert ids.shape[1] == 1024
        row = ids[0]
        starts = sum(np.array_equal(row[i:i + len(needle)], needle) for i in range(len(row) - len(needle)))
        assert starts == count  # the needles; questions say "magic number for"
        rows = batch["positions"] // ids.shape[1]
        assert int((batch["first"] & (rows == 0)).sum()) == 4  # the answer and three followups
    after = Batches(config, vocab)[3000]  # after the curriculum: the task's four needles again
    assert np.array_equal(after["ids"], Batches(TestbedTrainConfig(seed=3), vocab)[3000]["ids"])


def _weights(output, module: str) -> dict[str, torch.Tensor]:
    """The state dict of ``module`` (``model``, ``aux``) in the training state in ``output`` (empty if not there)."""
    from elastic_bench.training.engine import read_state

    record, tensors = read_state(output)
    prefix = f"{module}."
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


TOY = dict(seed=0, steps=3, batch_tokens=256, min_length=256, max_length=256, eval_samples=1, device="cpu",
           attention_aux_weight=0.0, end_slack=0)


def run(output, **options) -> RunOptions:
    return RunOptions(output=str(output), save_every=2, progress=False, **options)


def test_interrupted_and_resumed_training_equals_one_run_and_exports_a_loadable_model(tmp_path):
    from elastic_bench.modeling.loading import load_model

    config = TestbedTrainConfig(**TOY)
    straight = train(config, run(tmp_path / "a"), command="cmd")
    stopped = train(config, run(tmp_path / "b", max_minutes=1e-9))
    assert not stopped["complete"] and stopped["steps_done"] == 1
    resumed = train(config, run(tmp_path / "b"))
    assert straight["complete"] and resumed["complete"] and resumed["steps_done"] == 3
    a, b = _weights(tmp_path / "a", "model"), _weights(tmp_path / "b", "model")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    log = [json.loads(line) for line in (tmp_path / "a" / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 3 and all(0 <= v["first"] <= 1 for v in log[-1]["tasks"].values())
    assert log[-1]["key_matching"].keys() == {"selectivity", "layer", "head"}  # probed at the last step
    record = json.loads((tmp_path / "a" / "TRAINING.json").read_text())
    assert record["command"] == "cmd" and record["seed"] == 0 and record["versions"]["torch"]
    assert set(record["evaluation"]["full"]["tasks"]) == {f"testbed_{n}" for n in SPECS}
    assert record["evaluation"]["streaming"]["geometry"] == {"sink": 16, "local": 256}
    assert record["evaluation"]["key_matching"]["selectivity"] < 0.5  # three steps learn no key matching
    # what the model was trained on: the testbed generators, 3 steps of batch_tokens // length rows of length tokens
    provenance, batches = record["provenance"], Batches(config, build())
    lengths = [batches[step]["ids"].shape for step in range(3)]
    assert provenance == resumed["provenance"] and provenance["steps"] == 3 and provenance["recipe"] == "custom"
    assert provenance["tokens_seen"] == sum(rows * length for rows, length in lengths)
    assert provenance["data"]["identities"] == sorted(f"generator:testbed.{name}" for name in SPECS)
    assert provenance["data"]["tasks"] == {f"testbed_{name}": spec.category for name, spec in SPECS.items()}
    assert provenance["data"]["records"] == sum(rows for rows, _ in lengths)
    model, tokenizer = load_model(str(tmp_path / "a"), dtype=torch.bfloat16, device="cpu")
    assert model.num_parameters() == record["parameters"] == 6_832_384
    assert (tmp_path / "a" / "model.safetensors").stat().st_size < 16 * 2**20
    assert tokenizer.eos_token_id == build().eos_id and model.generation_config.eos_token_id == build().eos_id
    with pytest.raises(ValueError, match=r"different configuration \(seed\)"):
        train(TestbedTrainConfig(**(TOY | {"seed": 1})), run(tmp_path / "a"))


def test_key_aux_head_reads_each_needles_first_value_token_and_resumes(tmp_path):
    vocab = build()
    config = TestbedTrainConfig(seed=3, key_aux_weight=1.0)
    batch = Batches(config, vocab)[0]  # curriculum: multi-key only, four needles per row
    flat, values, keys = batch["ids"].reshape(-1), batch["needle_values"], batch["needle_keys"]
    assert len(values) == 4 * batch["ids"].shape[0] and np.isin(keys, vocab.key_ids).all()
    assert np.array_equal(flat[values - 2], keys) and np.isin(flat[values], vocab.number_ids).all()
    assert "needle_values" not in Batches(TestbedTrainConfig(seed=3, attention_aux_weight=0.0), vocab)[0]
    asked, asked_values = batch["asked"], batch["asked_values"]  # question and prefix, for the answer and 3 followups
    assert len(asked) == 2 * len(values) and np.isin(flat[asked], vocab.key_ids).all()
    width = batch["ids"].shape[1]
    needle_of = {(int(v) // width, int(k)): int(flat[v]) for v, k in zip(values, keys)}  # (row, key) -> first pair
    assert [needle_of[int(a) // width, int(flat[a])] for a in asked] == asked_values.tolist()
    assert np.array_equal(flat[batch["asked_needles"]], asked_values) and np.isin(batch["asked_needles"], values).all()
    assert np.array_equal(batch["asked_needles"] // width, asked // width)

    aux = TestbedTrainConfig(**(TOY | {"key_aux_weight": 1.0, "value_aux_weight": 0.5, "eval_samples": 0}))
    train(aux, run(tmp_path / "a"))
    train(aux, run(tmp_path / "b", max_minutes=1e-9))
    train(aux, run(tmp_path / "b"))
    a, b = (_weights(tmp_path / d, "aux") for d in "ab")
    assert a and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert a["weight"].shape[0] == len(vocab)
    a, b = (_weights(tmp_path / d, "model") for d in "ab")
    assert a and all(torch.equal(a[k], b[k]) for k in a)
    plain = train(TestbedTrainConfig(**(TOY | {"eval_samples": 0})), run(tmp_path / "c"))
    assert plain["complete"] and not _weights(tmp_path / "c", "aux")
    with pytest.raises(ValueError, match="attention_aux_weight must be non-negative"):
        TestbedTrainConfig(value_aux_weight=-1.0)


def test_attention_aux_loss_is_the_heads_attention_cross_entropy():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    config = model_config(build())
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    for parameter in model.parameters():
        parameter.data.normal_(0, 0.2)  # far from uniform attention
    inputs = {}
    attention = model.model.layers[3].self_attn
    attention.register_forward_pre_hook(
        lambda m, a, kw: inputs.update(x=(kw["hidden_states"], kw["position_embeddings"])), with_kwargs=True)
    with torch.no_grad():
        probs = model(torch.randint(0, 4000, (3, 40)), output_attentions=True).attentions[3]  # [B, H, L, L]
    queries, targets = torch.tensor([5, 39, 57, 82]), torch.tensor([3, 0, 57, 81])
    with torch.no_grad():
        loss = attention_aux_loss(attention, *inputs["x"], 5, queries, targets)
    expected = -probs[queries // 40, 5, queries % 40, targets % 40].log().mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5) and loss.item() > 0.5


def test_copy_sources_point_at_the_context_tokens_each_answer_copies():
    vocab = build()
    batch = Batches(TestbedTrainConfig(seed=2, attention_aux_weight=1.0), vocab)[5000]  # every task, 1K-4K
    flat, copies, sources = batch["ids"].reshape(-1), batch["copies"], batch["copy_sources"]
    assert np.array_equal(flat[copies + 1], flat[sources]) and (sources < copies).all()
    answers = batch["answer"].sum() - batch["first"].sum()  # every answer token but </s> copies a context token
    assert len(copies) == answers and np.array_equal(sources // batch["ids"].shape[1], copies // batch["ids"].shape[1])
    first_copies = np.isin(copies, batch["positions"][batch["first"]])
    words = np.concatenate([vocab.number_ids, vocab.noun_ids, vocab.adjective_ids, vocab.verb_ids])
    assert np.isin(flat[sources[first_copies]], words).all()  # a needle's first pair or the repeated sentence's word


def test_attention_aux_training_logs_every_heads_loss(tmp_path):
    only_multikey = {"niah_multikey": 1.0}
    config = TestbedTrainConfig(**(TOY | {"attention_aux_weight": 1.0, "eval_samples": 0,
                                          "task_weights": only_multikey}))
    assert train(config, run(tmp_path / "a"))["complete"]
    log = [json.loads(line) for line in (tmp_path / "a" / "train_log.jsonl").read_text().splitlines()]
    last = log[-1]
    assert last["attention_aux_writer"] >= 0 and last["attention_aux_matcher"] > 0 and last["attention_aux_reader"] > 0
    assert not _weights(tmp_path / "a", "aux")


def test_end_slack_ends_rows_early_and_pads_them_without_loss():
    vocab = build()
    plain = Batches(TestbedTrainConfig(seed=5, end_slack=0), vocab)[5000]  # after the curriculum: 1K, 2K or 4K
    assert (plain["ids"][:, -1] == vocab.eos_id).all()  # no slack: every row closes its answer at the last position
    curriculum = Batches(TestbedTrainConfig(seed=5, end_slack=16), vocab)[0]
    assert (curriculum["ids"][:, -1] == vocab.eos_id).all()
    batch = Batches(TestbedTrainConfig(seed=5, end_slack=16), vocab)[5000]
    ids, width = batch["ids"], batch["ids"].shape[1]
    ends = np.array([np.flatnonzero(row == vocab.eos_id).max() for row in ids])
    assert len(set(ends.tolist())) > 3 and ends.min() >= width - 17
    assert all((row[end + 1 :] == vocab.pad_id).all() for row, end in zip(ids, ends))
    scored_rows, scored_cols = np.divmod(batch["positions"], width)
    assert (scored_cols < ends[scored_rows]).all()  # nothing after </s> is scored
    with pytest.raises(ValueError, match="end_slack"):
        TestbedTrainConfig(end_slack=100)


def test_cli_defaults_are_the_first_stage_and_each_stages_recorded_command_gives_its_config():
    import shlex
    from importlib.resources import files

    from elastic_bench.cli import build_parser
    from elastic_bench.foundation.options import from_args

    def parsed(words):
        return from_args(TestbedTrainConfig, build_parser(words)[0].parse_args(words))

    assert parsed(["testbed", "train", "--output", "x"]) == TestbedTrainConfig()
    assert parsed(["testbed", "train", "--output", "x", "--no-dense-decode", "--streaming-tasks", "robust"]) == \
        TestbedTrainConfig(dense_decode=False, streaming_tasks="robust")
    def recorded(record):  # the shipped records also hold checkpoint_every, a run option (`RunOptions.save_every`)
        return TestbedTrainConfig(**{k: v for k, v in record["config"].items() if k != "checkpoint_every"})

    shipped = files("elastic_bench") / "data" / "testbed"
    first, second = (json.loads((shipped / f).read_text()) for f in ("stage1/TRAINING.json", "TRAINING.json"))
    assert recorded(first) == TestbedTrainConfig()  # the defaults are the shipped first stage
    for record in (first, second):
        assert record["complete"] and parsed(shlex.split(record["command"])[1:]) == recorded(record)
    assert second["config"]["dense_decode"] and second["config"]["init_from"]


def test_batches_mark_each_prompt_end_and_dense_decode_reaches_the_training_mask(tmp_path):
    vocab = build()
    batch = Batches(TestbedTrainConfig(seed=4), vocab)[5000]
    width = batch["ids"].shape[1]
    rows, cols = np.divmod(batch["positions"][batch["first"]], width)
    assert np.array_equal(batch["prompt_ends"], [cols[rows == r].min() + 1 for r in range(len(batch["ids"]))])
    small = dict(TOY | {"min_length": 512, "max_length": 512, "batch_tokens": 1024, "steps": 2, "eval_samples": 0,
                        "streaming_fraction": 1.0, "stage_fraction": 0.01, "task_weights": {"niah_recent": 1.0}})
    runs = {}
    for dense in (False, True):
        train(TestbedTrainConfig(**small, dense_decode=dense), run(tmp_path / str(dense)))
        log = [json.loads(line) for line in (tmp_path / str(dense) / "train_log.jsonl").read_text().splitlines()]
        assert log[-1]["streaming"]
        runs[dense] = _weights(tmp_path / str(dense), "model")
    assert any(not torch.equal(runs[False][k], runs[True][k]) for k in runs[False])
