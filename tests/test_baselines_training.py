"""train-duo / train-prulong: the passkey data, the gated attention, both trainers on tiny:llama, their exports."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from elastic_bench import apply, get_method
from elastic_bench.baselines.gates import binarize, gate_provenance
from elastic_bench.baselines.training.base import fit_to_model, fit_window
from elastic_bench.baselines.training.duo import DuoTrainConfig, TwoWay, lr_factor, train_duo
from elastic_bench.baselines.training.mixing import GatedHeads, GateRoute
from elastic_bench.baselines.training.passkeys import (
    NATO,
    PasskeyData,
    PasskeySamples,
    PromptPieces,
    fit_passkeys,
    passkey_tokens,
)
from elastic_bench.baselines.training.prulong import (
    PruLongTrainConfig,
    binary_masks,
    expected_sparsity,
    prob_zero,
    sample_z,
    train_prulong,
)
from elastic_bench.baselines.training.prulong import lr_factor as prulong_lr_factor
from elastic_bench.cli import main
from elastic_bench.kernels import Mode
from elastic_bench.training.engine import RunOptions

SMALL = PasskeyData(min_length=480, max_length=720, num_lengths=3, num_passkeys=2, passkey_length=8)


def test_passkey_samples_hold_their_passkeys_and_fit(tiny_models):
    _, tokenizer = tiny_models["llama"]
    samples = PasskeySamples(SMALL, tokenizer, seed=3, per_step=2)
    assert samples.words == tuple(NATO)
    for step in range(3):
        for sample in samples[step]:
            ids = sample.input_ids.tolist()
            assert len(ids) % 16 == 0 and len(ids) <= SMALL.max_length
            text = tokenizer.decode(ids[sample.answer_start:])
            assert text.count("Passkey:") == 2
            for answer in text.split("Passkey:")[1:]:  # each asked passkey is in the context
                words = answer.split()[: SMALL.passkey_length]
                assert all(w in NATO for w in words)
                assert " ".join(words) in tokenizer.decode(ids[: sample.answer_start])
    again = PasskeySamples(SMALL, tokenizer, seed=3, per_step=2)
    assert torch.equal(again[1][0].input_ids, samples[1][0].input_ids)  # a pure function of (seed, step, slot)
    assert not torch.equal(PasskeySamples(SMALL, tokenizer, seed=4, per_step=2)[1][0].input_ids,
                           samples[1][0].input_ids)
    lengths = {len(samples.sample(s, 0).input_ids) for s in range(6)}
    assert len(lengths) == 3  # every length of the grid is visited


def test_passkey_data_refuses_what_cannot_fit(tiny_models):
    _, tokenizer = tiny_models["llama"]
    with pytest.raises(ValueError, match="min_length 100 is below the .* tokens"):
        PasskeySamples(PasskeyData(min_length=100, max_length=720, num_passkeys=2, passkey_length=8), tokenizer, 0, 1)
    with pytest.raises(ValueError, match="num_passkeys must lie in"):
        PasskeyData(num_passkeys=21)
    with pytest.raises(FileNotFoundError, match="--haystack"):
        PasskeyData(haystack="/no/such/corpus.txt")


def test_unset_options_fit_the_model_and_keep_upstream_values_where_they_fit(tiny_models):
    _, tokenizer = tiny_models["llama"]
    pieces = PromptPieces(tokenizer)
    long = fit_passkeys(PasskeyData(), tokenizer, positions=1 << 18)
    assert (long.max_length, long.num_passkeys, long.passkey_length) == (32000, 10, 32)  # upstream's
    assert long.min_length >= passkey_tokens(pieces, NATO, 10, 32) and long.min_length % 16 == 0
    short = fit_passkeys(PasskeyData(), tokenizer, positions=1024)
    assert short.max_length == 1024 and short.passkey_length == 32 and 1 <= short.num_passkeys < 10
    assert passkey_tokens(pieces, NATO, short.num_passkeys, 32) <= 512 < passkey_tokens(  # as many as fit in half
        pieces, NATO, short.num_passkeys + 1, 32)
    sample = PasskeySamples(short, tokenizer, 0, 1).sample(0, 0, length=short.min_length)
    assert len(sample.input_ids) <= short.min_length
    tiny = fit_passkeys(PasskeyData(), tokenizer, positions=256)
    assert tiny.num_passkeys == 1 and tiny.passkey_length < 32  # one passkey, then shorter ones
    given = fit_passkeys(PasskeyData(min_length=4000, num_passkeys=3), tokenizer, positions=8192)
    assert (given.min_length, given.max_length, given.num_passkeys, given.passkey_length) == (4000, 8192, 3, 32)
    assert fit_window(None, None, (128, 256), 32000) == (128, 256)
    assert fit_window(None, None, (128, 1024), 4096) == (128, 1024)
    assert fit_window(None, None, (128, 1024), 1024) == (32, 256)  # halved to half of the longest sample
    assert fit_window(16, None, (128, 1024), 1024) == (16, 256)
    fitted, chosen = fit_to_model(PruLongTrainConfig(model="tiny:llama"), tokenizer)
    assert chosen["kind"] == "text" and fitted.data.num_passkeys is None  # PruLong's paper data: natural text
    fitted, chosen = fit_to_model(PruLongTrainConfig(model="tiny:llama", data=PasskeyData(kind="passkeys")), tokenizer)
    assert "kind" not in chosen and fitted.data.num_passkeys == 10 and (fitted.sink, fitted.local) == (128, 1024)


@pytest.mark.slow
@pytest.mark.parametrize("model, longest", [("tiny:llama", 32000), ("testbed", 4096)])
def test_train_duo_with_only_model_and_output_fits_the_model(model, longest, tmp_path, capsys):
    output = tmp_path / "duo"
    assert main(["train-duo", "--model", model, "--output", str(output), "--steps", "1", "--no-progress"]) == 0
    chosen = capsys.readouterr().out.splitlines()[0]
    assert chosen.startswith(f"train-duo chose for {model}: --min-length ")
    assert (f"--max-length {longest} --num-passkeys 10 --passkey-length 32 --data passkeys --sink 128 "
            "--local-window 256") in chosen
    settings = json.loads((output / "config.json").read_text())
    assert f"--min-length {settings['data']['min_length']} " in chosen and settings["local"] == 256


def test_train_prulong_with_only_model_and_output_narrows_its_window_for_a_short_context(tmp_path, capsys):
    args = ["train-prulong", "--model", "testbed", "--output", str(tmp_path / "pl"), "--max-length", "1024",
            "--steps", "1", "--batch-size", "1", "--no-progress"]
    assert main(args) == 0
    assert capsys.readouterr().out.splitlines()[0] == ("train-prulong chose for testbed: --data text --sink 32 "
                                                       "--local-window 256")  # natural text: no passkeys to fit
    settings = json.loads((tmp_path / "pl" / "config.json").read_text())
    assert settings["data"]["kind"] == "text" and settings["text_tokens"] == 4 * 1024


def test_given_values_that_cannot_hold_are_refused_in_one_line_before_the_model_loads(monkeypatch, capsys):
    def loaded(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr("elastic_bench.modeling.loading.load_model", loaded)
    refused = {
        ("--min-length", "5000"): "--min-length 5000 exceeds --max-length 4096 (chosen for the model)",
        ("--num-passkeys", "20", "--passkey-length", "32", "--max-length", "1000"): "20 passkeys of 32 words and",
        ("--min-length", "500", "--num-passkeys", "10"): "min_length 500 is below the",
        ("--max-length", "9000"): "exceeds the 4096 positions of testbed",
    }
    for flags, message in refused.items():
        assert main(["train-duo", "--model", "testbed", *flags]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1


def test_text_rows_are_consecutive_haystack_tokens_with_the_loss_on_every_token(tiny_models):
    _, tokenizer = tiny_models["llama"]
    data = PasskeyData(kind="text", max_length=256)
    samples = PasskeySamples(data, tokenizer, seed=1, per_step=2)
    stream = samples.haystack_tokens
    bos = tokenizer.encode("", add_special_tokens=True)
    rows = samples[0] + samples[1]
    for row in rows:
        ids = row.input_ids.tolist()
        assert len(ids) == 256 and row.answer_start == 0 and bool(row.answer_mask().all())
        body = ids[len(bos):]
        assert any(stream[i:i + len(body)] == body for i in range(len(stream) - len(body) + 1))
    assert len({tuple(r.input_ids.tolist()) for r in rows}) == 4  # seeded offsets differ
    assert torch.equal(PasskeySamples(data, tokenizer, seed=1, per_step=2)[1][0].input_ids, rows[2].input_ids)
    assert fit_passkeys(PasskeyData(kind="text"), tokenizer, positions=2048).num_passkeys is None  # nothing to fit


def test_haystack_files_and_the_testbed_tokenizer(tmp_path, tiny_models):
    from elastic_bench.modeling.loading import load_model

    _, tokenizer = tiny_models["llama"]
    corpus = tmp_path / "books.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": "Once upon a time there was a story. " * 40}) for _ in range(5)))
    samples = PasskeySamples(PasskeyData(**{**SMALL.__dict__, "haystack": str(corpus)}), tokenizer, 0, 1)
    assert "Once upon a time" in tokenizer.decode(samples[0][0].input_ids)
    _, testbed_tokenizer = load_model("testbed", device="cpu")
    assert PasskeySamples(SMALL, testbed_tokenizer, 0, 1).words == tuple("0123456789")  # NATO words are unknown


def test_two_way_forward_distills_nothing_at_alpha_one_and_streams_at_zero(tiny_models):
    model, tokenizer = tiny_models["llama"]
    ids = PasskeySamples(SMALL, tokenizer, 0, 1)[0][0].input_ids
    method = GatedHeads(sink=4, local=16, granularity="token", two_way=True)
    with torch.no_grad(), apply(method, model):
        ones = TwoWay(model)(ids, GateRoute(torch.ones(2, 2)))
        zeros = TwoWay(model)(ids, GateRoute(torch.zeros(2, 2)))
    torch.testing.assert_close(ones[1], ones[0])
    with torch.no_grad(), apply(get_method("streaming", sink=4, local=16), model):
        streamed = model.base_model(input_ids=ids[None]).last_hidden_state[0]
    torch.testing.assert_close(zeros[1], streamed, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(zeros[0], ones[0])  # the teacher row never changes


def test_schedules_follow_upstream():
    assert [round(lr_factor(s, 100), 3) for s in (0, 9, 19, 50, 85, 99)] == [0.1, 0.5, 1.0, 1.0, 0.75, 0.1]
    config = PruLongTrainConfig(steps=100)
    assert prulong_lr_factor(0, config) == 0.0 and prulong_lr_factor(5, config) == 0.5
    assert prulong_lr_factor(10, config) == 1.0 and math.isclose(prulong_lr_factor(100, config), 0.01)


def test_hard_concrete_distribution():
    log_alpha = torch.tensor([-3.0, 0.0, 4.0])
    u = torch.rand(20000, 3, generator=torch.Generator().manual_seed(0)).clamp(1e-8, 1 - 1e-8)
    z = sample_z(log_alpha.expand(20000, 3), u)
    assert float(z.min()) >= 0.0 and float(z.max()) <= 1.0
    torch.testing.assert_close((z == 0).float().mean(0), prob_zero(log_alpha), atol=0.01, rtol=0)
    assert expected_sparsity(torch.full((4, 2), 4.0)) < 0.01  # PruLong's initial masks are all open
    masks = binary_masks(torch.tensor([[3.0, -1.0], [2.0, 5.0]]), sparsity=0.5)
    assert masks.tolist() == [[1.0, 0.0], [0.0, 1.0]]


def _duo_config(**kw):
    return DuoTrainConfig(model="tiny:llama", data=SMALL, steps=3, sink=16, local=64, lr=0.1, **kw)


def test_train_duo_moves_alpha_and_its_file_drives_duo_attention(tmp_path, tiny_models):
    config, options = _duo_config(), RunOptions(output=str(tmp_path / "duo"), save_every=2, progress=False)
    gates, run = train_duo(config, options)
    assert run.complete and len(run.log) == 3
    assert gates.shape == (2, 2) and (gates < 1.0).any() and ((gates >= 0) & (gates <= 1)).all()
    assert all(r["distill_loss"] >= 0 and r["reg_loss"] > 0 for r in run.log)
    saved = np.loadtxt(tmp_path / "duo" / "full_attention_heads.tsv", delimiter="\t")
    np.testing.assert_allclose(saved, gates)
    settings = json.loads((tmp_path / "duo" / "config.json").read_text())
    assert settings["steps_done"] == 3 and settings["lr"] == 0.1 and settings["haystack_source"] == "generated"
    # what the gates were trained on, as the held-out rule reads it: DuoAttention's passkey generator (the generated
    # haystack only pads), 3 samples of 480-720 tokens
    provenance = gate_provenance(tmp_path / "duo" / "full_attention_heads.tsv")
    assert provenance == gate_provenance(tmp_path / "duo") == settings["provenance"]
    assert provenance["data"]["identities"] == ["generator:duo.passkey"] and provenance["recipe"] == "custom"
    assert provenance["steps"] == 3 and provenance["tokens_seen"] == sum(r["tokens"] for r in run.log)
    assert provenance["data"]["source"] == "synthetic" and provenance["data"]["lengths"] == [480, 720]

    model, tokenizer = tiny_models["llama"]
    ids = tokenizer("a b c d e f g h " * 20, return_tensors="pt").input_ids
    method = get_method("duo_attention", pattern=str(tmp_path / "duo"), sparsity=0.5, local=16)
    with torch.no_grad(), apply(method, model) as handle:
        model(ids)
    expected = np.where(binarize(gates, 0.5), Mode.FULL, Mode.STREAMING)
    assert handle.decisions()[0].tolist() == expected.tolist()

    again, rerun = train_duo(config, options)  # complete: resumes at the end, trains nothing
    assert rerun.start == 3 and np.array_equal(again, gates)
    with pytest.raises(ValueError, match="different configuration .*reg_weight"):
        train_duo(_duo_config(reg_weight=0.5), options)


def test_duo_gates_are_bf16_parameters_unless_asked_for_fp32(tmp_path):
    for dtype, bf16_exact in (("bfloat16", True), ("float32", False)):
        gates, _ = train_duo(_duo_config(gate_dtype=dtype), RunOptions(output=str(tmp_path / dtype), progress=False))
        assert (gates < 1.0).all()  # every gate moved
        rounded = torch.from_numpy(gates).to(torch.bfloat16).double().numpy()
        assert np.array_equal(rounded, gates) == bf16_exact  # upstream's released gates are bf16-exact


def test_duo_attention_with_every_gate_one_equals_full(tmp_path, tiny_models):
    model, tokenizer = tiny_models["qwen3"]
    path = tmp_path / "full_attention_heads.tsv"
    np.savetxt(path, np.ones((2, model.config.num_key_value_heads)), delimiter="\t")
    ids = tokenizer("the quick brown fox " * 40, return_tensors="pt").input_ids
    with torch.no_grad():
        with apply(get_method("full"), model):
            full = model(ids).logits
        with apply(get_method("duo_attention", pattern=str(path), sparsity=None, local=8), model):
            duo = model(ids).logits
    torch.testing.assert_close(duo, full)


def test_train_prulong_moves_toward_its_target_and_exports_binary_masks(tmp_path, tiny_models):
    config = PruLongTrainConfig(model="tiny:llama", data=SMALL, steps=6, batch_size=2, sink=16, local=64, target=0.5,
                                sparsity_warmup=0.0, warmup=0.0)
    masks, run = train_prulong(config, RunOptions(output=str(tmp_path / "pl"), save_every=3, progress=False))
    first, last = run.log[0], run.log[-1]
    assert last["expected_sparsity"] > first["expected_sparsity"]  # toward the target 0.5 from ~0
    assert last["lambda1"] < 0 < last["lambda2"]  # the multipliers ascend while sparsity lies below the target
    assert sorted(masks.flatten().tolist()) == [0.0, 0.0, 1.0, 1.0]
    log_alpha = np.loadtxt(tmp_path / "pl" / "log_alpha.tsv", delimiter="\t")
    assert not np.allclose(log_alpha, 4.0, atol=0.05)  # the masks moved
    provenance = gate_provenance(tmp_path / "pl")  # rows of the generated haystack, which is what they hold
    assert provenance["data"]["identities"] == ["generator:testbed.noise"] and provenance["data"]["tasks"] == {
        "text": None}
    assert provenance["steps"] == 6 and provenance["tokens_seen"] == 6 * 2 * 720 and provenance["data"]["records"] == 12
    model, tokenizer = tiny_models["llama"]
    ids = tokenizer("a b c d e f g h " * 20, return_tensors="pt").input_ids
    with torch.no_grad(), apply(get_method("prulong", pattern=str(tmp_path / "pl"), local=16), model) as handle:
        model(ids)
    assert handle.decisions()[0].tolist() == np.where(masks == 1, Mode.FULL, Mode.STREAMING).tolist()


def test_gate_commands_check_their_inputs_before_loading(capsys):
    assert main(["train-prulong", "--target", "1.5"]) == 2
    assert "target must lie in [0, 1)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["train-prulong", "--help"])
    assert exit_.value.code == 0 and "--sparsity-warmup" in capsys.readouterr().out


def test_records_replace_the_passkeys(tmp_path, tiny_models):
    _, tokenizer = tiny_models["llama"]
    records = tmp_path / "records.jsonl"
    records.write_text("\n".join(json.dumps({"prompt": f"question {i}?", "answer": f"answer {i}", "category": "qa"})
                                 for i in range(3)))
    samples = PasskeySamples(PasskeyData(records=str(records), max_length=64), tokenizer, seed=0, per_step=3)
    batch = samples[0]
    assert sorted(tokenizer.decode(s.input_ids[s.answer_start:], skip_special_tokens=True) for s in batch) == [
        "answer 0", "answer 1", "answer 2"]  # one epoch visits every record once
    assert samples.settings() == {"records": str(records), "num_records": 3}
    data = samples.data_provenance(steps=1)  # hand-made records name no identities: none to check
    assert data["source"] == "file" and data["identities"] == [] and data["tasks"] == {"qa": "qa"}
    assert data["records"] == 3 and samples.tokens_seen(2) == 2 * sum(len(s.input_ids) for s in batch)
    with pytest.raises(FileNotFoundError, match="--records"):
        PasskeyData(records=str(tmp_path / "missing.jsonl"))


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train-duo", "train-prulong"])
def test_two_processes_on_gloo_give_the_gates_of_one(command, tmp_path):
    """torchrun with 2 CPU ranks (gloo, FSDP2 over the frozen model), one sample each, against one process with both
    samples of each step."""
    import os
    import subprocess
    import sys

    args = [command, "--model", "tiny:llama", "--steps", "2", "--batch-size", "2", "--min-length", "480",
            "--max-length", "720", "--num-lengths", "3", "--num-passkeys", "2", "--passkey-length", "8", "--sink",
            "16", "--local-window", "64", "--device", "cpu", "--no-progress"]
    if command == "train-prulong":
        args += ["--warmup", "0", "--sparsity-warmup", "0", "--target", "0.5"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, "-m", "elastic_bench", *args, "--output", str(tmp_path / "one")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "elastic_bench", *args, "--output", str(tmp_path / "two")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert two.returncode == 0, two.stderr[-2000:]
    name = "full_attention_heads.tsv" if command == "train-duo" else "log_alpha.tsv"
    a, b = (np.loadtxt(tmp_path / d / name, delimiter="\t") for d in ("one", "two"))
    assert not np.allclose(a, 1.0 if command == "train-duo" else 4.0, atol=1e-3)  # the gates moved
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_an_unusable_training_backend_is_refused_before_the_model_loads(monkeypatch, capsys, tmp_path):
    def loaded(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr("elastic_bench.modeling.loading.load_model", loaded)
    assert main(["train-duo", "--backend", "flex", "--device", "cpu", "--output", str(tmp_path / "duo")]) == 2
    assert "attention backend 'flex' is not available on cpu" in capsys.readouterr().err
