"""Router training: straight-through gradients, frozen backbone, the acceptance run, resume, CLI, 2 processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from test_method_elastic import NEEDS_XATTENTION

from elastic_bench import apply
from elastic_bench.method import ModeConfig, synthetic_records
from elastic_bench.method.elastic import Elastic, TrainingRoute
from elastic_bench.method.objective import LagrangeMultipliers, omega_msr, sparsity_penalty
from elastic_bench.method.relaxation import gumbel_noise
from elastic_bench.method.trainer import RouterTrainConfig, train
from elastic_bench.modeling.loading import load_model
from elastic_bench.training.engine import LossModel, RunOptions, row_inputs, training_backend

TARGETS = {"sensitive": 0.3, "robust": 1.0}
SMALL = ModeConfig(sink=4, local=32, granularity="token")


def config(**overrides) -> RouterTrainConfig:
    base = dict(
        model="tiny:qwen3", data="synthetic", steps=3, rows_per_step=1, pack_tokens=1024, targets=TARGETS,
        attention=SMALL, synthetic_samples=16, synthetic_length=250, eval_samples=2, device="cpu",
    )
    return RouterTrainConfig(**{**base, **overrides})


def options(tmp_path, save_every: int = 50) -> RunOptions:
    return RunOptions(output=str(tmp_path / "out"), save_every=save_every, progress=False)


def fresh_model():
    return load_model("tiny:qwen3", dtype=torch.float32, device="cpu")


def _frozen_model_routers_and_row():
    """The frozen tiny model, an `Elastic` method holding fresh routers for it, and one packed row of 4 samples."""
    from elastic_bench.method.data import to_example
    from elastic_bench.training.engine import pack, tokenize

    model, tokenizer = fresh_model()
    model.requires_grad_(False)
    method = Elastic()
    method.routers = _bank(2, 2, 16)
    examples = [to_example(r) for r in synthetic_records(4, length=250)]
    return model, method, pack(tokenize(examples, tokenizer, ["sensitive", "robust"], 1024), 1024)[0]


def test_router_gradients_come_through_the_straight_through_decision(tmp_path):
    """The LM loss alone reaches every router through ``r·full + (1 − r)·sparse``; the backbone gets no gradient."""
    model, method, row = _frozen_model_routers_and_row()
    noise = gumbel_noise((row.num_samples, 2, 2, 2), torch.Generator().manual_seed(1))
    route = TrainingRoute(1.0, noise, row.prompt_lens)
    with apply(method, model, backend="reference"):
        loss_sum, count = LossModel(model)(*row_inputs(row, "cpu"), training_route=route)
        r = route.stacked([0, 1])
        (loss_sum / count).backward()
    assert r.shape == (row.num_samples, 2, 2)
    assert set(route.decisions) == {(sample, layer) for sample in range(row.num_samples) for layer in range(2)}
    assert set(r.detach().unique().tolist()) == {0.0, 1.0}  # hard decisions in the forward pass
    assert r.requires_grad
    for router in method.routers.layers:
        assert float(torch.stack([p.grad.norm() for p in router.parameters()]).norm()) > 0
    assert all(p.grad is None for p in model.parameters())
    # the penalty adds the Ω gradient on top
    lam = LagrangeMultipliers(2)
    penalty = sparsity_penalty(omega_msr(r), row.categories, torch.tensor([0.3, 1.0]), lam)
    assert penalty.requires_grad


def test_the_training_route_travels_with_the_forward_and_nothing_stays_on_the_method(tmp_path):
    """Two routes in flight on one method do not mix; a forward without a route routes by argmax, as at inference."""
    model, method, row = _frozen_model_routers_and_row()
    loss_model = LossModel(model)
    with apply(method, model, backend="reference") as handle:
        routes = [TrainingRoute(1.0, gumbel_noise((row.num_samples, 2, 2, 2), torch.Generator().manual_seed(seed)),
                                row.prompt_lens) for seed in (1, 2)]
        for route in routes:
            loss_model(*row_inputs(row, "cpu"), training_route=route)
        again = TrainingRoute(1.0, routes[0].noise, row.prompt_lens)
        loss_model(*row_inputs(row, "cpu"), training_route=again)
        assert torch.equal(again.stacked([0, 1]), routes[0].stacked([0, 1]))  # same noise, same decisions
        assert not any(isinstance(v, (TrainingRoute, torch.Tensor)) for v in vars(method).values())
        assert not {"training_route", "_pending", "_train_r"} & set(vars(method))
        handle.reset()
        with torch.no_grad():
            loss_model(*row_inputs(row, "cpu")[:4], None)
        assert handle.decisions().shape == (row.num_samples, 2, 2)  # argmax routing, recorded by the glue
    with pytest.raises(RuntimeError, match="no routing decision"):
        TrainingRoute(1.0, routes[0].noise, row.prompt_lens).stacked([0, 1])


def _bank(layers, heads, dim):
    from elastic_bench.method import RouterConfig

    return RouterConfig(layers, heads, dim, attention=SMALL).build()


def test_training_changes_routers_and_leaves_the_backbone_bit_identical(tmp_path):
    model, tokenizer = fresh_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = train(config(router_lr=1e-2), options(tmp_path), loaded=(model, tokenizer))
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None and not p.requires_grad for p in model.parameters())
    assert all(record["router_grad_norm"] > 0 for record in result.log)
    untrained = _bank(2, 2, 16)
    gen = torch.Generator().manual_seed(0)
    for router in untrained.layers:
        router.reset_parameters(gen)
    trained = result.routers.state_dict()
    assert any(not torch.equal(trained[k], v) for k, v in untrained.state_dict().items())
    record = result.log[-1]
    assert {"step", "tau", "lm_loss", "omega_msr", "lambda1", "lambda2", "router_grad_norm"} <= record.keys()
    saved = json.loads((tmp_path / "out" / "router_config.json").read_text())
    assert saved["training"]["steps_done"] == 3 and saved["training"]["targets"] == TARGETS
    assert saved["training"]["final_omega_msr"] == result.final_omega


@pytest.mark.slow
def test_acceptance_run_reaches_each_category_target(tmp_path):
    """tiny:qwen3 on the CPU, targets 0.3 and 1.0: hard ΩMSR (argmax routing) ends within 0.1 of each target, on the
    training prompts and on held-out prompts, and λ moves in the direction that enforces the constraint."""
    from elastic_bench.tasks.base import render

    model, tokenizer = fresh_model()
    cfg = config(steps=300, synthetic_samples=64, router_lr=3e-3, lambda_lr=0.1, eval_samples=16)
    result = train(cfg, options(tmp_path), loaded=(model, tokenizer))
    for category, target in TARGETS.items():
        assert abs(result.final_omega[category] - target) <= 0.1, result.final_omega
    method = Elastic()
    method.routers = result.routers
    held_out = {c: [] for c in TARGETS}
    with torch.no_grad(), apply(method, model, backend="reference") as handle:
        for record in synthetic_records(20, length=250, seed=999):
            handle.reset()
            model(torch.tensor([render(tokenizer, record["prompt"])]))
            held_out[record["category"]].append(handle.stats()["omega_msr"])
    for category, target in TARGETS.items():
        assert abs(sum(held_out[category]) / len(held_out[category]) - target) <= 0.1, held_out
    first, log = result.log[0], result.log
    # sensitive starts above its target (Ω ≈ 0.5 > 0.3): λ1 rises; robust is below 1.0 throughout: λ1 falls
    assert log[19]["lambda1"]["sensitive"] > first["lambda1"]["sensitive"]
    assert result.lambdas["robust"][0] < first["lambda1"]["robust"]
    assert all(result.lambdas[c][1] > first["lambda2"][c] for c in TARGETS)


def test_gumbel_sigmoid_routers_train_save_and_load(tmp_path, tiny_models):
    from elastic_bench.method import load_routers

    result = train(config(relaxation="sigmoid", router_lr=1e-2), options(tmp_path), loaded=fresh_model())
    assert result.routers[0].cls_router_head_agnostic[4].out_features == 1
    assert all(record["router_grad_norm"] > 0 for record in result.log)
    loaded = load_routers(tmp_path / "out")
    assert loaded.config.num_logits == 1
    model, tokenizer = tiny_models["qwen3"]
    method = Elastic()
    method.routers = loaded
    with torch.no_grad(), apply(method, model, backend="reference") as handle:
        model(tokenizer("some prompt " * 20, return_tensors="pt").input_ids)
    assert handle.decisions().shape == (1, 2, 2)


def test_centered_routers_learn_their_feature_mean_once_and_save_it(tmp_path):
    from elastic_bench.method import load_routers

    result = train(config(center_features=True), options(tmp_path), loaded=fresh_model())
    means = torch.stack([router.feature_mean for router in result.routers.layers])  # [L, H, D]
    assert means.shape == (2, 2, result.routers.config.head_dim) and means.abs().sum() > 0
    loaded = load_routers(tmp_path / "out")
    assert loaded.config.center_features
    torch.testing.assert_close(torch.stack([r.feature_mean for r in loaded.layers]), means.cpu())
    # computed once, before training: a one-step run starts from the same mean
    again = train(config(center_features=True, steps=1), options(tmp_path / "b"), loaded=fresh_model())
    torch.testing.assert_close(torch.stack([r.feature_mean for r in again.routers.layers]), means)


def test_gradient_checkpointing_recomputes_the_same_decisions(tmp_path):
    plain = train(config(steps=1), options(tmp_path / "a"), loaded=fresh_model())
    ckpt = train(config(steps=1, gradient_checkpointing=True), options(tmp_path / "b"), loaded=fresh_model())
    for key, value in plain.routers.state_dict().items():
        torch.testing.assert_close(ckpt.routers.state_dict()[key], value)
    assert plain.log[0]["router_grad_norm"] == pytest.approx(ckpt.log[0]["router_grad_norm"], rel=1e-5)


@NEEDS_XATTENTION
def test_length_padding_for_compiled_backends_changes_nothing(tmp_path, monkeypatch):
    """With ``flex`` the training branches run on tensors zero-padded to a length bucket; here "flex" is the
    reference kernel, so the padded run must train exactly the routers of the unpadded one."""
    from elastic_bench.kernels import hybrid
    from elastic_bench.kernels.hybrid.naive import naive_hybrid_attention

    seen = []

    def spy(q, *args):
        if torch.is_grad_enabled():  # training branches (the final evaluation runs without gradients, unpadded)
            seen.append(q.shape[2])
        return naive_hybrid_attention(q, *args)

    monkeypatch.setitem(hybrid._BACKENDS, "flex", hybrid.Backend("flex", spy, lambda device: True, 10))
    attention = ModeConfig(mode="fa-xa", sink=4, local=32, granularity="token", block_size=32, xa_stride=8)
    plain = train(config(steps=2, attention=attention), options(tmp_path / "a"), loaded=fresh_model())
    padded = train(config(steps=2, attention=attention, backend="flex"), options(tmp_path / "b"),
                   loaded=fresh_model())
    assert seen and all(length % 32 == 0 for length in seen)
    for key, value in plain.routers.state_dict().items():
        torch.testing.assert_close(padded.routers.state_dict()[key], value, rtol=1e-5, atol=1e-6)


def _masked_sdpa(calls):
    """A stand-in for compiled FlexAttention on the CPU (which has no flex backward): SDPA under the block mask's
    mask_mod evaluated densely, so the packed path's masks decide what each query sees."""
    from torch.nn.attention.flex_attention import create_mask

    def attend(q, k, v, mask, scale):
        calls.append(q.shape[2])
        group = q.shape[1] // k.shape[1]
        dense = create_mask(mask.mask_mod, 1, 1, q.shape[2], k.shape[2], device=q.device)
        k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=scale)

    return attend


@pytest.mark.parametrize("granularity", ["token", "block"])
def test_a_packed_row_attended_whole_trains_the_routers_of_the_per_sample_path(tmp_path, monkeypatch, granularity):
    """On ``flex`` a packed row's samples are pooled, routed and attended in one call per layer (document masks,
    `Elastic.attend_row`); it must train the routers the per-sample path trains (``reference``), gradients through
    the decisions included."""
    from elastic_bench.kernels import hybrid
    from elastic_bench.kernels.hybrid import flex
    from elastic_bench.kernels.hybrid.naive import naive_hybrid_attention

    calls: list[int] = []
    monkeypatch.setitem(hybrid._BACKENDS, "flex", hybrid.Backend("flex", naive_hybrid_attention, lambda d: True, 10))
    monkeypatch.setattr(flex, "flex_masked_attention", _masked_sdpa(calls))
    attention = ModeConfig(sink=4, local=40, granularity=granularity, block_size=16)
    per_sample = train(config(steps=2, attention=attention, center_features=True), options(tmp_path / "a"),
                       loaded=fresh_model())
    whole = train(config(steps=2, attention=attention, center_features=True, backend="flex"),
                  options(tmp_path / "b"), loaded=fresh_model())
    assert calls and all(length % 16 == 0 for length in calls)  # the packed path ran, on padded rows
    for a, b in zip(per_sample.log, whole.log):
        assert b["lm_loss"] == pytest.approx(a["lm_loss"], rel=1e-4)
        assert b["omega_msr"] == pytest.approx(a["omega_msr"])
        assert b["router_grad_norm"] == pytest.approx(a["router_grad_norm"], rel=1e-3)
    for key, value in per_sample.routers.state_dict().items():
        torch.testing.assert_close(whole.routers.state_dict()[key], value, rtol=1e-4, atol=1e-5)


def test_document_masks_classify_blocks_as_their_mask_mod_does():
    """A block the mask lists as full has every pair visible; a block it leaves out has none (packed samples,
    padding after them, full and streaming branches of both granularities)."""
    from torch.nn.attention.flex_attention import create_mask

    from elastic_bench.kernels import StreamingGeometry
    from elastic_bench.kernels.hybrid.flex import document_block_mask

    bs = 16
    for geometry in (None, StreamingGeometry(4, 40, "token"), StreamingGeometry(16, 48, "block")):
        for bounds, length in (([0, 37, 100, 101, 180], 208), ([0, 64, 128], 128), ([0, 5, 300], 304)):
            mask = document_block_mask(bounds, length, geometry, bs, "cpu")
            n = length // bs
            pairs = create_mask(mask.mask_mod, 1, 1, length, length, device="cpu")[0, 0]
            blocks = pairs.view(n, bs, n, bs).permute(0, 2, 1, 3).flatten(2)
            listed = {}
            for name, num, idx in (("full", mask.full_kv_num_blocks, mask.full_kv_indices),
                                   ("partial", mask.kv_num_blocks, mask.kv_indices)):
                table = torch.zeros(n, n, dtype=torch.bool)
                for r in range(n):
                    table[r, idx[0, 0, r, : num[0, 0, r]].long()] = True
                listed[name] = table
            assert not (listed["full"] & listed["partial"]).any()
            assert blocks.all(-1)[listed["full"]].all()
            assert not blocks.any(-1)[~(listed["full"] | listed["partial"])].any()
            # each sample's tokens see only their own sample's earlier tokens
            doc = torch.searchsorted(torch.tensor([*bounds[1:], length]), torch.arange(length), right=True)
            assert not pairs[doc[:, None] != doc[None, :]].any()


def test_interrupted_run_resumes_to_the_same_routers(tmp_path, monkeypatch):
    import elastic_bench.method.trainer as trainer

    whole = train(config(steps=4), options(tmp_path / "whole", save_every=2), loaded=fresh_model())
    real = trainer.temperature

    def interrupt(step, *args):
        if step == 3:
            raise KeyboardInterrupt
        return real(step, *args)

    monkeypatch.setattr(trainer, "temperature", interrupt)
    cfg, split = config(steps=4), options(tmp_path / "split", save_every=2)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, split, loaded=fresh_model())
    monkeypatch.setattr(trainer, "temperature", real)
    assert len((tmp_path / "split" / "out" / "train_log.jsonl").read_text().splitlines()) == 3
    resumed = train(cfg, split, loaded=fresh_model())
    for key, value in whole.routers.state_dict().items():
        torch.testing.assert_close(resumed.routers.state_dict()[key], value)
    assert [r["step"] for r in resumed.log] == [1, 2, 3, 4]
    again = train(cfg, split, loaded=fresh_model())  # complete: nothing more to train
    assert [r["step"] for r in again.log] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="different configuration.*router_lr"):
        train(config(steps=4, router_lr=1e-2), options(tmp_path / "split", save_every=2), loaded=fresh_model())


def test_training_backend_needs_a_differentiable_available_backend():
    assert training_backend(None, torch.device("cpu")) == "reference"
    with pytest.raises(ValueError, match="'flex' is not available on cpu.*--backend reference"):
        training_backend("flex", torch.device("cpu"))
    with pytest.raises(ValueError, match="differentiable"):
        training_backend("triton", torch.device("cpu"))


def test_cli_trains_on_records_and_rejects_unknown_categories(tmp_path, capsys):
    from elastic_bench.cli import main

    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in synthetic_records(8, length=150)))
    args = ["train-router", "--model", "tiny:qwen3", "--data", str(data), "--steps", "2", "--rows-per-step", "1",
            "--pack-tokens", "1024", "--sink", "4", "--local-window", "32", "--granularity", "token", "--device", "cpu",
            "--output", str(tmp_path / "out")]
    assert main([*args, "--target", "sensitive=0.3", "--target", "robust=1.0"]) == 0
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"router.safetensors", "router_config.json", "train_log.jsonl", "train_state.safetensors",
            "train_state.json"} <= names
    assert not any(name.endswith(".pt") for name in names)
    log = [json.loads(line) for line in (tmp_path / "out" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2]
    captured = capsys.readouterr()
    assert "final hard ΩMSR" in captured.out
    assert "train-router: 100%" in captured.err and "final evaluation: 100%" in captured.err  # a bar for each phase
    assert main([*args, "--output", str(tmp_path / "other"), "--target", "sensitive=0.3"]) == 2
    assert "['robust'] have no target" in capsys.readouterr().err


def test_a_misspelt_target_is_refused_with_a_suggestion_before_the_model_loads(tmp_path, capsys, no_model):
    from elastic_bench.cli import main

    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in synthetic_records(4, length=50)))
    for source in (str(data), "synthetic", "records"):
        code = main(["train-router", "--data", source, "--target", "sensitiv=0.9", "--target", "robust=1.0",
                     "--output", str(tmp_path / "out")])
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and err.endswith("--target sensitiv=0.9 names no category of the data: did you mean --target "
                                          "sensitive=0.9?"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_two_processes_on_gloo_give_the_same_router_as_one(tmp_path):
    """torchrun with 2 CPU ranks (gloo, FSDP2 over the backbone) on the same global batch as one process."""
    from safetensors.torch import load_file

    args = ["train-router", "--model", "tiny:qwen3", "--data", "synthetic", "--steps", "3", "--rows-per-step", "2",
            "--pack-tokens", "1024", "--sink", "4", "--local-window", "32", "--granularity", "token", "--device", "cpu",
            "--router-lr", "1e-2", "--target", "sensitive=0.3", "--target", "robust=1.0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, "-m", "elastic_bench", *args, "--output", str(tmp_path / "one")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "elastic_bench",
         *args, "--output", str(tmp_path / "two")], env=env, capture_output=True, text=True, timeout=300,
    )
    assert two.returncode == 0, two.stderr[-2000:]
    a, b = load_file(tmp_path / "one" / "router.safetensors"), load_file(tmp_path / "two" / "router.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-6)
    training = json.loads((tmp_path / "two" / "router_config.json").read_text())["training"]
    assert training["replica_max_abs_diff"] == 0.0  # both ranks hold the same routers
    logs = [(tmp_path / d / "train_log.jsonl").read_text().splitlines() for d in ("one", "two")]
    for x, y in zip(*logs):
        x, y = json.loads(x), json.loads(y)
        assert x["omega_msr"] == y["omega_msr"] and x["lambda1"] == pytest.approx(y["lambda1"])
