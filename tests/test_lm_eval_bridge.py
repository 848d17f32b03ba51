"""The lm-evaluation-harness bridge: `ElasticLM` requests under a method, and `elastic-bench lm-eval` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("lm_eval", reason="the [lm-eval] extra is not installed (`make test` installs it)")
from lm_eval.api.instance import Instance  # noqa: E402

from elastic_bench.lm_eval_bridge import ElasticLM  # noqa: E402

REQUESTS = [("The grass is green. The sky is blue. " * 6, " The sun is yellow."), ("a b c d e f g h i j " * 5, " k")]


def loglikelihoods(**model_args) -> list[float]:
    lm = ElasticLM(pretrained="tiny:qwen3", device="cpu", **model_args)
    try:
        instances = [Instance("loglikelihood", {}, args, i) for i, args in enumerate(REQUESTS)]
        return [logprob for logprob, _ in lm.loglikelihood(instances, disable_tqdm=True)]
    finally:
        lm.close()


def test_method_changes_loglikelihoods_only_when_it_drops_keys():
    full = loglikelihoods(method="full")
    covering = loglikelihoods(method="streaming", method_sink=4, method_local=4096)
    narrow = loglikelihoods(method="streaming", method_sink=2, method_local=8)
    assert covering == pytest.approx(full, abs=1e-4)
    assert all(abs(a - b) > 1e-3 for a, b in zip(narrow, full))


def test_generation_runs_under_the_method_and_records_sparsity():
    lm = ElasticLM(pretrained="tiny:qwen3", device="cpu", method="streaming", method_local=8, batch_size=2)
    try:
        requests = [Instance("generate_until", {}, (ctx, {"until": ["\n"], "max_gen_toks": 3}), i)
                    for i, (ctx, _) in enumerate(REQUESTS)]
        outputs = lm.generate_until(requests, disable_tqdm=True)
        assert len(outputs) == 2 and all(isinstance(o, str) for o in outputs)
        assert lm.handle.stats()["omega_msr"] == 1.0
    finally:
        lm.close()
    assert lm.model.config._attn_implementation == "sdpa"


def test_cli_runs_an_offline_task(tmp_path):
    (tmp_path / "toy.jsonl").write_text('{"prompt": "a b c", "answer": "d"}\n{"prompt": "x y", "answer": "z"}\n')
    (tmp_path / "toy.yaml").write_text(
        "task: toy_copy\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tmp_path / 'toy.jsonl'}\ntest_split: test\noutput_type: generate_until\n"
        'doc_to_text: "{{prompt}}"\ndoc_to_target: "{{answer}}"\n'
        'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 4\nmetric_list:\n  - metric: exact_match\n'
    )
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "elastic_bench", "lm-eval", "run", "--model", "elastic", "--model_args",
         "pretrained=tiny:qwen3,method=streaming,method_local=8", "--device", "cpu", "--tasks", "toy_copy",
         "--include_path", str(tmp_path), "--output_path", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (results,) = (tmp_path / "out").glob("*/results_*.json")
    data = json.loads(results.read_text())
    assert "toy_copy" in data["results"] and data["config"]["model"] == "elastic"
