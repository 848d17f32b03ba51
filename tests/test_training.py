"""The training engine: resume, time limit, fingerprint, log, the pickle-free training state, the run options."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from elastic_bench.training.engine import (
    LOG_FILE,
    STATE_JSON,
    STATE_TENSORS,
    Objective,
    RunOptions,
    fingerprint,
    fit,
    read_state,
)


class Steps(torch.utils.data.Dataset):
    """Item ``s``: 3 micro-batches of (x [4, 3], y [4]) drawn from (seed, s) alone."""

    def __init__(self, steps: int, seed: int = 0):
        self.steps, self.seed = steps, seed

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int):
        gen = torch.Generator().manual_seed(self.seed * 1000 + step)
        return [(torch.randn(4, 3, generator=gen), torch.randn(4, generator=gen)) for _ in range(3)]


class Regression(Objective):
    """Least squares of a linear model plus a scalar offset, in two param groups with their own rates."""

    def __init__(self, steps: int, lr: float = 0.1):
        torch.manual_seed(0)
        self.linear, self.offset = nn.Linear(3, 1), nn.Module()
        self.offset.value = nn.Parameter(torch.zeros(()))
        self.modules = {"linear": self.linear, "offset": self.offset}
        self.optimizer = torch.optim.AdamW([{"params": self.linear.parameters(), "lr": lr},
                                            {"params": [self.offset.value], "lr": lr, "weight_decay": 0.0}])
        self.batches = Steps(steps)
        self.clipped = list(self.linear.parameters()) + [self.offset.value]
        self.grad_clip = 1.0
        self.grad_norms = {"linear": list(self.linear.parameters())}
        self.steps, self.lr, self.saved, self.seen = steps, lr, [], []

    def learning_rate(self, step):
        return [self.lr * (1 - step / self.steps), self.lr / 2]

    def losses(self, step, batch):
        self.seen.append(step)
        self.total = 0.0
        for x, y in batch:
            loss = ((self.linear(x)[:, 0] + self.offset.value - y) ** 2).mean() / len(batch)
            yield loss
            assert self.linear.weight.grad is not None  # the engine ran backward before resuming
            self.total += float(loss.detach())

    def record(self, step, seconds):
        return {"loss": self.total, "lr": [g["lr"] for g in self.optimizer.param_groups]}

    def save(self, step):
        self.saved.append(step)


def weights(objective: Regression) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in objective.linear.state_dict().items()} | {"offset": objective.offset.value.data}


def run(tmp_path, steps=6, max_minutes=None, **fields):
    objective = Regression(steps)
    options = RunOptions(output=str(tmp_path), save_every=2, max_minutes=max_minutes, progress=False)
    result = fit(objective, options, steps, fingerprint({"steps": steps, "lr": 0.1, **fields}))
    return objective, result


def test_a_run_stopped_and_resumed_equals_one_run_bit_for_bit(tmp_path, monkeypatch):
    whole, result = run(tmp_path / "whole")
    assert result.complete and result.start == 0 and [r["step"] for r in result.log] == [1, 2, 3, 4, 5, 6]
    assert whole.saved == [2, 4, 6]
    assert result.log[0]["lr"] == [0.1, 0.05] and result.log[1]["lr"] == pytest.approx([0.1 * 5 / 6, 0.05])
    assert {"grad_norm", "linear_grad_norm"} <= result.log[0].keys()

    stopped, first = run(tmp_path / "split", max_minutes=1e-9)  # the limit is up after the first step
    assert not first.complete and first.done == 1 and stopped.saved == [1]
    resumed, second = run(tmp_path / "split")
    assert second.start == 1 and resumed.seen == [1, 2, 3, 4, 5] and second.complete
    assert second.seconds >= first.seconds
    for key, value in weights(whole).items():
        assert torch.equal(weights(resumed)[key], value), key
    assert [r["loss"] for r in second.log] == [r["loss"] for r in result.log]
    lines = [json.loads(line) for line in (tmp_path / "split" / LOG_FILE).read_text().splitlines()]
    assert lines == second.log
    again, third = run(tmp_path / "split")  # complete: nothing more to train
    assert again.seen == [] and third.complete and [r["step"] for r in third.log] == [1, 2, 3, 4, 5, 6]


class Killed(Regression):
    """`Regression`, killed (an interrupt) when it reaches step ``at``."""

    def __init__(self, steps: int, at: int):
        super().__init__(steps)
        self.at = at

    def losses(self, step, batch):
        if step == self.at:
            raise KeyboardInterrupt
        yield from super().losses(step, batch)


def test_a_run_killed_before_its_first_step_checkpoint_keeps_the_steps_of_its_time_checkpoints(tmp_path):
    """Checkpoints every ``save_minutes`` as well as every ``save_every`` steps: killed at step 4 of 6, long before
    its first step checkpoint (100), the run resumes from step 3 (time checkpoints after every step here) with the
    log of steps 1-3, and ends as a run never killed."""
    options = RunOptions(output=str(tmp_path / "killed"), save_every=100, save_minutes=1e-9, progress=False)
    killed = Killed(6, at=3)
    with pytest.raises(KeyboardInterrupt):
        fit(killed, options, 6, fingerprint({"steps": 6}))
    assert killed.saved == [1, 2, 3]  # a checkpoint (and an export) at each time checkpoint
    resumed = Regression(6)
    result = fit(resumed, options, 6, fingerprint({"steps": 6}))
    assert result.start == 3 and resumed.seen == [3, 4, 5] and [r["step"] for r in result.log] == [1, 2, 3, 4, 5, 6]
    whole, _ = run(tmp_path / "whole")
    for key, value in weights(whole).items():
        assert torch.equal(weights(resumed)[key], value), key
    untimed = Killed(6, at=3)  # by steps alone, the same kill loses every step
    with pytest.raises(KeyboardInterrupt):
        fit(untimed, RunOptions(output=str(tmp_path / "untimed"), save_every=100, save_minutes=None, progress=False),
            6, fingerprint({"steps": 6}))
    assert untimed.saved == [] and read_state(tmp_path / "untimed") is None


def test_the_log_is_cut_back_to_the_resumed_step(tmp_path):
    run(tmp_path, steps=4)
    with (tmp_path / LOG_FILE).open("a") as log:  # lines an interrupted run wrote after its last checkpoint
        log.write(json.dumps({"step": 5, "loss": 0.0}) + "\n" + '{"step": 6, "lo')
    _, result = run(tmp_path, steps=4)
    assert [r["step"] for r in result.log] == [1, 2, 3, 4]
    assert [json.loads(line)["step"] for line in (tmp_path / LOG_FILE).read_text().splitlines()] == [1, 2, 3, 4]


def test_the_state_is_safetensors_plus_json_without_pickle(tmp_path):
    objective, _ = run(tmp_path, steps=2)
    record, tensors = read_state(tmp_path)
    assert json.loads((tmp_path / STATE_JSON).read_text()) == record
    assert record["step"] == 2 and record["modules"] == ["linear", "offset"]
    assert record["fingerprint"] == {"steps": 2, "lr": 0.1}
    assert torch.equal(tensors["linear.weight"], objective.linear.weight.detach())
    optimizer = objective.optimizer.state_dict()
    assert [g["lr"] for g in record["optimizer"]["param_groups"]] == [g["lr"] for g in optimizer["param_groups"]]
    for index, state in optimizer["state"].items():
        for key, value in state.items():
            assert torch.equal(tensors[f"optimizer.{index}.{key}"], value)
    assert not list(tmp_path.glob("*.pt")) and not list(tmp_path.glob("*.tmp"))
    data = (tmp_path / STATE_TENSORS).read_bytes()  # a safetensors file: header length, JSON header, raw tensors
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    assert json.loads(header["__metadata__"]["state"]) == record


def test_a_different_configuration_is_refused_naming_the_fields(tmp_path):
    run(tmp_path, steps=2)
    with pytest.raises(ValueError, match=r"different configuration \(lr, seed\); use another --output"):
        objective = Regression(2)
        fit(objective, RunOptions(output=str(tmp_path), progress=False), 2,
            fingerprint({"steps": 2, "lr": 0.2, "seed": 1}))
    assert fingerprint({"a": (1, 2), "b": 3, "device": "x"}) == {"a": [1, 2], "b": 3}  # RESUMABLE fields left out


def test_run_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="save_every"):
        RunOptions(output=str(tmp_path), save_every=0)
    with pytest.raises(ValueError, match="max_minutes"):
        RunOptions(output=str(tmp_path), max_minutes=0)
    with pytest.raises(ValueError, match="save_minutes must be > 0"):
        RunOptions(output=str(tmp_path), save_minutes=0)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ValueError, match="is a file; expected a folder"):  # refused before any training starts
        RunOptions(output=str(tmp_path / "a-file"))
