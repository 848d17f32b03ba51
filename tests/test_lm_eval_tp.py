"""The lm-eval bridge under tensor parallelism: ``tp=2`` over 2 gloo ranks (torchrun, CPU, tiny:llama, fp32) gives every
method's loglikelihoods, generations and sparsity (per task and per request) of one process, through `ElasticLM`
directly and through ``elastic-bench lm-eval run``.

Run as a script (``python tests/test_lm_eval_tp.py TP OUT GATES``, under torchrun for ``TP`` > 1), this file evaluates
the requests of `test_lm_eval_bridge` under every method and rank 0 writes what it found to ``OUT``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="the [lm-eval] extra is not installed (`make test` installs it)")
from test_lm_eval_bridge import FIXTURES, METHODS, TASKS, model_args, requests  # noqa: E402

from elastic_bench.evaluation.lm_eval_bridge import ElasticLM  # noqa: E402
from elastic_bench.modeling.attention import attention_modules  # noqa: E402
from elastic_bench.modeling.tensor_parallel import kv_heads  # noqa: E402

GATES = "1\t0\n0\t1\n"  # tiny:llama's layers × KV heads: one FULL and one streaming head per layer, on different ranks


def evaluate(tp: int, gates: str) -> dict[str, dict]:
    """By method: the results of each request type (`test_lm_eval_bridge.requests`), the sparsity of each (task,
    request type) and of each request, and the KV heads ``[start, stop)`` of each layer this rank holds, with ``tp``
    ranks per model."""
    found = {}
    for name in METHODS:
        lm = ElasticLM(pretrained="tiny:llama", device="cpu", dtype="float32", batch_size=2, tp=tp,
                       **model_args(name, gates))
        try:
            outputs = {kind: getattr(lm, kind)(batch, disable_tqdm=True) for kind, batch in requests().items()}
            heads = [[kv_heads(m).start, kv_heads(m).stop] for m in attention_modules(lm.model)]  # this rank's
            found[name] = {"outputs": outputs, "sparsity": lm.sparsity, "per_request": lm.per_request, "heads": heads}
        finally:
            lm.close()
    return found


def launch(cwd: Path, processes: int, command: list[str]) -> None:
    """``command`` (the words after the interpreter) in ``cwd``, in one process or under torchrun in ``processes``."""
    launcher = [sys.executable]
    if processes > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
    done = subprocess.run([*launcher, *command], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                               "HF_DATASETS_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]


def assert_same(found: dict[str, list], expected: dict[str, list]) -> None:
    """The results of each request type: generations and greedy flags exactly, loglikelihoods within 1e-6 of their
    size, or 1e-5 (the ranks' partial sums add in another order)."""
    for kind, results in expected.items():
        if kind == "generate_until":
            assert found[kind] == results
        elif kind == "loglikelihood":  # (loglikelihood, greedy) pairs
            assert [greedy for _, greedy in found[kind]] == [greedy for _, greedy in results]
            assert [lp for lp, _ in found[kind]] == pytest.approx([lp for lp, _ in results], rel=1e-6, abs=1e-5)
        else:
            assert found[kind] == pytest.approx(results, rel=1e-6, abs=1e-5), kind


@pytest.mark.slow
def test_tensor_parallel_requests_give_what_one_process_gives(tmp_path):
    (tmp_path / "gates.tsv").write_text(GATES)
    script = str(Path(__file__).resolve())
    launch(tmp_path, 1, [script, "1", "one.json", "gates.tsv"])
    launch(tmp_path, 2, [script, "2", "tp.json", "gates.tsv"])
    one, tp = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("one", "tp"))
    assert list(tp) == list(METHODS)
    for name in METHODS:
        assert one[name]["heads"] == [[0, 2]] * 2 and tp[name]["heads"] == [[0, 1]] * 2  # rank 0 holds KV head 0
        assert_same(tp[name]["outputs"], one[name]["outputs"])
        assert tp[name]["sparsity"] == one[name]["sparsity"], name  # ΩMSR, ΩESR, FULL share, KV bytes: every head
        assert tp[name]["per_request"] == one[name]["per_request"], name
    elastic = {round(r["omega_msr"], 9) for r in one["elastic"]["per_request"].values() if r}
    assert len(elastic) > 2  # the untrained router routes the requests differently
    assert 0 < one["duo_attention"]["sparsity"]["toy_loglikelihood/loglikelihood"]["omega_msr"] < 1


@pytest.mark.slow
def test_lm_eval_run_with_tp_writes_what_one_process_writes(tmp_path):
    """``elastic-bench lm-eval run`` with ``tp=2`` under torchrun: rank 0 writes the results, samples (each with its
    requests' sparsity) and sparsity file of one process."""
    args = ",".join(["pretrained=tiny:llama", "dtype=float32", *(f"{k}={v}" for k, v in model_args("elastic", "")
                                                                   .items())])

    def run(name: str, processes: int, extra: str) -> Path:
        launch(FIXTURES, processes, [
            "-m", "elastic_bench", "lm-eval", "run", "--model", "elastic", "--model_args", args + extra,
            "--tasks", ",".join(TASKS), "--include_path", str(FIXTURES), "--device", "cpu", "--batch_size", "2",
            "--output_path", str(tmp_path / name), "--log_samples"])
        (folder,) = (tmp_path / name).iterdir()
        return folder

    one, tp = run("one", 1, ""), run("tp", 2, ",tp=2")
    assert len(list(tp.iterdir())) == len(list(one.iterdir())) == 2 + len(TASKS)  # results, sparsity, samples
    (sparsity_one,), (sparsity_tp,) = one.glob("sparsity_*.json"), tp.glob("sparsity_*.json")
    assert json.loads(sparsity_tp.read_text())["sparsity"] == json.loads(sparsity_one.read_text())["sparsity"]
    for task in TASKS:
        (a,), (b,) = one.glob(f"samples_{task}_*.jsonl"), tp.glob(f"samples_{task}_*.jsonl")
        lines_one, lines_tp = ([json.loads(line) for line in p.read_text().splitlines()] for p in (a, b))
        assert [s["elastic_bench"] for s in lines_tp] == [s["elastic_bench"] for s in lines_one], task
        if TASKS[task] == "generate_until":
            assert [s["resps"] for s in lines_tp] == [s["resps"] for s in lines_one]
        else:
            assert responses(lines_tp, task) == pytest.approx(responses(lines_one, task), rel=1e-6, abs=1e-5), task


def responses(lines: list[dict], task: str) -> list[float]:
    """The loglikelihoods in a loglikelihood task's logged samples."""
    return [float(r[0][0] if TASKS[task] == "loglikelihood" else r[0]) for line in lines for r in line["resps"]]

if __name__ == "__main__":
    tp_size, out, gate_file = sys.argv[1:]
    evaluated = evaluate(int(tp_size), gate_file)
    if int(os.environ.get("RANK", "0")) == 0:
        Path(out).write_text(json.dumps(evaluated))
