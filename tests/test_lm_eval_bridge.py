"""The lm-evaluation-harness bridge: `ElasticLM` requests under a method, batch-size invariance, lm-eval's own command
line (in-process) on the local tasks of `tests/fixtures/lm_eval`, the sparsity file, argument checking, registration."""

from __future__ import annotations

import glob
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lm_eval", reason="the [lm-eval] extra is not installed (`make test` installs it)")
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import Registry  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

from elastic_bench.cli import main  # noqa: E402
from elastic_bench.evaluation.lm_eval_bridge import ElasticLM, cli  # noqa: E402
from elastic_bench.modeling.generation import generate  # noqa: E402
from elastic_bench.modeling.loading import load_model  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "lm_eval"
TASKS = {"toy_generate": "generate_until", "toy_loglikelihood": "loglikelihood", "toy_rolling": "loglikelihood_rolling",
         "toy_choice": "loglikelihood"}  # multiple_choice tasks send loglikelihood requests
DOCS = [json.loads(line) for line in (FIXTURES / "docs.jsonl").read_text().splitlines()]
# Every registered method, with knobs that make it sparse on the fixtures' short documents.
METHODS = {
    "full": {},
    "streaming": {"method_sink": 2, "method_local": 8},
    "duo_attention": {"method_sparsity": 0.5, "method_sink": 2, "method_local": 8},
    "prulong": {"method_sparsity": 0.5, "method_sink": 2, "method_local": 8},
    "xattention": {"method_block_size": 16, "method_stride": 4, "method_threshold": 0.5},
    "elastic": {"method_router": "untrained", "method_mode": "fa-ssa", "method_sink": 2, "method_local": 8,
                "method_granularity": "token"},
    "infllm_v2": {"method_block_size": 16, "method_kernel_size": 8, "method_kernel_stride": 4, "method_topk": 2,
                  "method_window_size": 16, "method_dense_len": 0},
    "moba": {"method_chunk_size": 16, "method_topk": 2, "method_block_size": 16},
    "nsa": {"method_block_size": 16, "method_kernel_size": 8, "method_kernel_stride": 4, "method_topk": 3},
}
GATED = ("duo_attention", "prulong")  # methods that read a gate file (`pattern`)


@pytest.fixture(scope="module")
def gates(tmp_path_factory) -> str:
    """A gate file for tiny:llama's 2 layers × 2 KV heads."""
    path = tmp_path_factory.mktemp("gates") / "full_attention_heads.tsv"
    np.savetxt(path, np.array([[1.0, 0.1], [0.2, 0.9]]), delimiter="\t")
    return str(path)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    """tiny:llama saved as a folder, so that lm-eval's own `hf` model can load the same weights."""
    path = tmp_path_factory.mktemp("tiny_llama")
    model, tokenizer = load_model("tiny:llama", device="cpu")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def model_args(name: str, gates: str) -> dict:
    return {"method": name, **METHODS[name], **({"method_pattern": gates} if name in GATED else {})}


def requests() -> dict[str, list[Instance]]:
    """One batch of each request type from the fixture documents, of varied lengths."""
    def make(kind, args):
        return [Instance(kind, {}, a, i, metadata=(f"toy_{kind}", i, 1)) for i, a in enumerate(args)]

    return {
        "loglikelihood": make("loglikelihood", [(d["prompt"], c) for d in DOCS for c in d["choices"][:2]]),
        "loglikelihood_rolling": make("loglikelihood_rolling", [(d["text"],) for d in DOCS]),
        # 7 prompts: batches of 4 and 3 at batch size 4, so the last batch is not one prompt as at batch size 1
        "generate_until": make("generate_until", [(p, {"until": ["\n"], "max_gen_toks": 2}) for p in
                                                  [*(d["prompt"] for d in DOCS), *(d["text"] for d in DOCS[:2])]]),
    }


def run_requests(batch_size: int, **args) -> tuple[dict[str, list], dict]:
    lm = ElasticLM(pretrained="tiny:llama", device="cpu", batch_size=batch_size, **args)
    try:
        outputs = {kind: getattr(lm, kind)(batch, disable_tqdm=True) for kind, batch in requests().items()}
        return outputs, lm.sparsity
    finally:
        lm.close()


@pytest.mark.parametrize("name", list(METHODS))
def test_batch_size_changes_no_loglikelihood_generation_or_sparsity(name, gates):
    one, sparsity_one = run_requests(1, **model_args(name, gates))
    four, sparsity_four = run_requests(4, **model_args(name, gates))
    assert [lp for lp, _ in four["loglikelihood"]] == pytest.approx([lp for lp, _ in one["loglikelihood"]], abs=1e-4)
    assert four["loglikelihood_rolling"] == pytest.approx(one["loglikelihood_rolling"], abs=1e-4)
    assert four["generate_until"] == one["generate_until"]
    for key, stats in sparsity_one.items():  # each row's ΩMSR/ΩESR is its own, whatever its neighbours
        for stat in ("omega_msr", "omega_esr", "num_samples"):
            assert sparsity_four[key][stat] == pytest.approx(stats[stat], abs=1e-9), (key, stat)
    generated = "toy_generate_until/generate_until"  # the mean per generated row of what its cache kept
    for stat in ("kv_bytes", "kv_bytes_full"):
        assert sparsity_four[generated][stat] == sparsity_one[generated][stat] > 0, stat
    assert "kv_bytes" not in sparsity_one["toy_loglikelihood/loglikelihood"]  # no row generated
    if name != "full":
        assert sparsity_one["toy_loglikelihood/loglikelihood"]["omega_msr"] > 0
        assert sparsity_one["toy_loglikelihood_rolling/loglikelihood_rolling"]["omega_esr"] > 0


def test_batch_size_detection_is_not_counted_in_the_sparsity(gates):
    """With ``batch_size=auto`` lm-eval runs probing forwards of its own; each task's sparsity covers the requests'
    rows alone, as with a fixed batch size."""
    _, fixed = run_requests(1, **model_args("duo_attention", gates))
    lm = ElasticLM(pretrained="tiny:llama", device="cpu", batch_size="auto", max_batch_size=2,
                   **model_args("duo_attention", gates))
    try:
        lm.loglikelihood(requests()["loglikelihood"], disable_tqdm=True)
        probed = lm.handle.stats()["num_samples"]
        auto = lm.sparsity
    finally:
        lm.close()
    key = "toy_loglikelihood/loglikelihood"
    assert probed > auto[key]["num_samples"]  # the probing forwards ran through the method (the test can fail)
    for stat in ("omega_msr", "omega_esr", "num_samples"):
        assert auto[key][stat] == pytest.approx(fixed[key][stat], abs=1e-9), stat
    assert len(auto[key]["fraction_full"]) == len(fixed[key]["fraction_full"])


def test_loglikelihoods_on_the_testbed_warn_that_it_cannot_model_real_text(caplog):
    lm = ElasticLM(pretrained="testbed", device="cpu", method="full")
    try:
        batches = requests()
        bridge = "elastic_bench.evaluation.lm_eval_bridge"
        with caplog.at_level("WARNING", logger=bridge):
            lm.generate_until(batches["generate_until"][:1], disable_tqdm=True)
            assert not [r for r in caplog.records if r.name == bridge]  # generation is what the testbed does
            lm.loglikelihood(batches["loglikelihood"][:2], disable_tqdm=True)
        (warning,) = [r.getMessage() for r in caplog.records if r.name == bridge]
        assert warning.startswith("the testbed model cannot model real text") and "task toy_loglikelihood" in warning
    finally:
        lm.close()


def test_greedy_generation_runs_the_shared_loop_and_gives_transformers_text(monkeypatch):
    """A greedy batch runs `elastic_bench.modeling.generation.generate`: a row stops once a stop string appears (with
    transformers' ``generate`` every row runs until all are done) and lm-eval's text is the same."""
    from lm_eval.models.utils import postprocess_generated_text

    from elastic_bench.evaluation import lm_eval_bridge

    calls = []
    monkeypatch.setattr(lm_eval_bridge, "generate", lambda *a, **k: calls.append(generate(*a, **k)) or calls[-1])
    lm = ElasticLM(pretrained="tiny:llama", device="cpu", batch_size=4, **METHODS["streaming"], method="streaming")
    try:
        context, mask = lm.tok_batch_encode([d["prompt"] for d in DOCS[:4]])
        budget = context.shape[1] + 24
        plain = HFLM._model_generate(lm, context, budget, [], attention_mask=mask, do_sample=False)
        stop = [lm.tok_decode(plain[0, context.shape[1] + 5 : context.shape[1] + 6].tolist())]  # row 0's 6th token
        ours = lm._model_generate(context, budget, stop, attention_mask=mask, do_sample=False)
        theirs = HFLM._model_generate(lm, context, budget, stop, attention_mask=mask, do_sample=False)
    finally:
        lm.close()
    (batch,) = calls
    assert len(batch.rows[0].tokens) <= 6 < 24 == max(len(row.tokens) for row in batch.rows)  # row 0 stopped early
    texts = [[postprocess_generated_text(lm.tok_decode(row[context.shape[1]:].tolist()), stop, None) for row in out]
             for out in (ours, theirs)]
    assert texts[0] == texts[1] and any(len(t) > 3 for t in texts[0])


def test_method_changes_loglikelihoods_only_when_it_drops_keys():
    def loglikelihoods(**args):
        return [lp for lp, _ in run_requests(2, **args)[0]["loglikelihood"]]

    full = loglikelihoods(method="full")
    assert loglikelihoods(method="streaming", method_sink=4, method_local=4096) == pytest.approx(full, abs=1e-4)
    narrow = loglikelihoods(method="streaming", method_sink=2, method_local=8)
    assert max(abs(a - b) for a, b in zip(narrow, full)) > 1e-3


def lm_eval_run(tmp_path, monkeypatch, entry, model: str, args: str, *extra: str) -> Path:
    """Run lm-eval's command line in-process on the fixture tasks (``entry``: lm-eval's own `cli_evaluate` or the
    wrapper `cli`); returns the folder lm-eval wrote its results in."""
    monkeypatch.chdir(FIXTURES)  # the tasks' data_files are relative to it
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / model
    argv = ["--model", model, "--model_args", args, "--tasks", ",".join(TASKS), "--include_path", str(FIXTURES),
            "--output_path", str(out), "--log_samples", *extra]
    if entry is cli:
        assert cli(argv) == 0
    else:
        monkeypatch.setattr(sys, "argv", ["lm_eval", *argv])
        entry()
    (folder,) = out.iterdir()
    return folder


def samples(folder: Path, task: str) -> list[dict]:
    (path,) = glob.glob(str(folder / f"samples_{task}_*.jsonl"))
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_lm_eval_cli_full_equals_hf_and_writes_sparsity_beside_the_results(tmp_path, monkeypatch, tiny_llama):
    from lm_eval.__main__ import cli_evaluate

    elastic = lm_eval_run(tmp_path, monkeypatch, cli, "elastic", f"pretrained={tiny_llama},method=full,dtype=float32",
                          "--batch_size", "4")  # no --device: lm-eval's default cuda:0 falls back to the CPU
    hf = lm_eval_run(tmp_path, monkeypatch, cli_evaluate, "hf", f"pretrained={tiny_llama},dtype=float32",
                     "--batch_size", "4", "--device", "cpu")
    for task, kind in TASKS.items():
        ours, theirs = samples(elastic, task), samples(hf, task)
        if kind == "generate_until":
            assert [s["resps"] for s in ours] == [s["resps"] for s in theirs]
        else:
            flat = [float(r[0][0] if kind == "loglikelihood" else r[0]) for s in ours for r in s["resps"]]
            ref = [float(r[0][0] if kind == "loglikelihood" else r[0]) for s in theirs for r in s["resps"]]
            assert flat == pytest.approx(ref, abs=1e-5), task
        for line in ours:  # one entry per request, none of them sparse
            assert [entry["omega_msr"] for entry in line["elastic_bench"]] == [0.0] * len(line["arguments"]), task
    (results,) = elastic.glob("results_*.json")
    sparsity = json.loads((elastic / results.name.replace("results_", "sparsity_")).read_text())
    assert sparsity["method"] == {"name": "full", "label": "full", "options": {}}
    assert set(sparsity["sparsity"]) == {f"{task}/{kind}" for task, kind in TASKS.items()}
    assert all(s["omega_msr"] == 0.0 and s["num_samples"] > 0 for s in sparsity["sparsity"].values())
    assert json.loads(results.read_text())["config"]["elastic_bench"] == sparsity


def lm_eval_rows(lm: ElasticLM, task: str, args: dict) -> list[list[int]]:
    """The model input of each row lm-eval runs for the request ``args`` (a sample's ``arguments`` entry), by
    lm-eval's own tokenization and truncation: a rolling document's windows, else one row."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    if TASKS[task] == "loglikelihood_rolling":
        windows = get_rolling_token_windows(token_list=lm.tok_encode(args["arg_0"]), prefix_token=lm.prefix_token_id,
                                            max_seq_len=lm.max_length, context_len=1)
        return [(context + target)[:-1] for context, target in map(make_disjoint_window, windows)]
    if TASKS[task] == "generate_until":
        budget = lm.max_length - args["arg_1"]["max_gen_toks"]
        return [lm.tok_encode(args["arg_0"], left_truncate_len=budget)]
    context, continuation = lm._encode_pair(args["arg_0"], args["arg_1"])
    return [(context + continuation)[-(lm.max_length + 1):][:-1]]


def test_samples_carry_each_requests_sparsity_whatever_the_batch_size(tmp_path, monkeypatch):
    import lm_eval
    import torch
    from lm_eval.__main__ import cli_evaluate
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    from elastic_bench import apply, get_method

    # the untrained router routes each row on its content, so rows given to the wrong request would show;
    # max_length 64 splits the rolling documents into 1–4 windows and makes one-token choices share a row
    args = {**METHODS["elastic"], "method": "elastic", "max_length": 64}
    # batch size 4 through lm-eval's own command line (it knows `elastic`: this process imported the bridge)
    four = lm_eval_run(tmp_path, monkeypatch, cli_evaluate, "elastic",
                       ",".join(["pretrained=tiny:llama", *(f"{k}={v}" for k, v in args.items())]), "--batch_size", "4")
    # batch size 1 through the Python API, saved by lm-eval's tracker as its command line does
    lm = ElasticLM(pretrained="tiny:llama", device="cpu", batch_size=1, **args)
    tracker = EvaluationTracker(output_path=str(tmp_path / "one"))
    try:
        results = lm_eval.simple_evaluate(model=lm, tasks=list(TASKS), log_samples=True, evaluation_tracker=tracker,
                                          task_manager=TaskManager(include_path=str(FIXTURES), include_defaults=False))
    finally:
        lm.close()
    logged = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=logged)
    for task in TASKS:
        tracker.save_results_samples(task_name=task, samples=logged[task])
    (one,) = (tmp_path / "one").iterdir()

    # each request recomputed on its own: lm-eval's rows of it, one forward each under the same method
    model, _ = load_model("tiny:llama", device="cpu")
    method = get_method("elastic", **{k.removeprefix("method_"): v for k, v in METHODS["elastic"].items()})
    seen = set()
    with apply(method, model) as handle, torch.no_grad():
        for task in TASKS:
            lines = samples(four, task)
            assert [line["doc_id"] for line in lines] == [line["doc_id"] for line in samples(one, task)]
            assert len(lines) == len(DOCS)
            for line, other in zip(lines, samples(one, task)):
                requests = list(line["arguments"].values())
                assert len(line["elastic_bench"]) == len(requests) == len(other["elastic_bench"]), task
                for entry, same, request in zip(line["elastic_bench"], other["elastic_bench"], requests):
                    assert entry == pytest.approx(same, abs=1e-9), (task, line["doc_id"])  # batch size 4 vs 1
                    rows = lm_eval_rows(lm, task, request)
                    per_row = []
                    for row in rows:
                        handle.reset()
                        model(input_ids=torch.tensor([row]))
                        (sample,) = handle.stats()["per_sample"]
                        per_row.append(sample)
                    tokens = [len(row) for row in rows]  # ΩMSR weighted by tokens, ΩESR by causal pairs
                    pairs = [t * (t + 1) / 2 for t in tokens]
                    expected = {
                        "omega_msr": sum(t * s["omega_msr"] for t, s in zip(tokens, per_row)) / sum(tokens),
                        "omega_esr": sum(p * s["omega_esr"] for p, s in zip(pairs, per_row)) / sum(pairs),
                        "tokens": sum(tokens),
                    }
                    assert entry == pytest.approx(expected, abs=1e-9), (task, line["doc_id"], len(rows))
                    seen.add((round(entry["omega_msr"], 6), len(rows)))
    assert len({msr for msr, _ in seen}) > 2 and max(windows for _, windows in seen) > 2  # a test that can fail


def test_sparsity_file_matches_the_handle_per_task(tmp_path, monkeypatch, gates):
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    monkeypatch.chdir(FIXTURES)
    lm = ElasticLM(pretrained="tiny:llama", device="cpu", batch_size=4, **model_args("streaming", gates))
    tracker = EvaluationTracker(output_path=str(tmp_path))
    tasks = TaskManager(include_path=str(FIXTURES), include_defaults=False)
    try:
        for task in ("toy_rolling", "toy_loglikelihood"):
            results = lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=tasks, evaluation_tracker=tracker)
            tracker.save_results_aggregated(results=results, samples=None)
            (path,) = tmp_path.glob(f"*/sparsity_{tracker.date_id}.json")
            written = json.loads(path.read_text())["sparsity"][f"{task}/{TASKS[task]}"]
            stats = lm.handle.stats()  # the statistics of the task that ran last
            assert written["num_samples"] == stats["num_samples"] > 0
            assert written["omega_esr"] == pytest.approx(stats["omega_esr"]) and written["omega_msr"] == 1.0
    finally:
        lm.close()


@pytest.mark.parametrize("args, message", [
    ("methd=streaming", "--model_args of `elastic` (method 'full'): unknown model argument 'methd'; did you mean "
                        "method, max_length? (valid: pretrained, backend,"),
    ("method=streaming,method_local=many", "method_local must be"),
])
def test_bad_model_arguments_end_in_one_line_and_exit_status_2(args, message, capsys):
    status = main(["lm-eval", "run", "--model", "elastic", "--model_args", f"pretrained=tiny:llama,{args}",
                   "--tasks", "toy_generate", "--include_path", str(FIXTURES)])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert status == 2 and not captured.out and len(err) == 1
    assert message in err[0] and err[0].startswith("elastic-bench: error:")


def test_an_unknown_lm_eval_flag_is_one_line_naming_the_closest_and_listing_every_flag(capsys):
    status = main(["lm-eval", "run", "--model", "elastic", "--tasks", "toy_generate", "--batch-size", "4"])
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err.startswith("elastic-bench: error: lm-eval run: unknown argument '--batch-size'; did "
                                          "you mean --batch_size")
    assert "--model_args" in err and "--output_path" in err and "--tasks" in err


def test_lm_evals_help_still_prints(capsys):
    assert main(["lm-eval", "run"]) == 0
    assert "usage: lm-eval run" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    ({"method": "streaming", "method_lcoal": 8}, "'method_lcoal'; did you mean method_local"),
    ({"method": "streaming", "dtype": "float33"}, "dtype must be auto or a torch dtype name"),
    ({"kernel_backnd": "auto"}, "did you mean kernel_backend"),
    ({"kernel_backend": "triton"}, "attention backend 'triton' cannot run on cpu"),
    ({"tp": "two"}, "tp must be a whole number of ranks"),
    ({"tp": 2}, "tp=2 needs torchrun: torchrun --nproc-per-node 2 -m elastic_bench lm-eval run"),
    ({"tp_plan": "auto"}, "the elastic model is sharded by tp=N under torchrun"),
    ({"pretrained": "./no-such-model"}, "no such model folder or file: ./no-such-model"),
])
def test_bad_model_arguments_are_refused_before_the_model_loads(args, message, monkeypatch):
    from elastic_bench.evaluation import lm_eval_bridge

    monkeypatch.setattr(lm_eval_bridge, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        ElasticLM(**{"pretrained": "tiny:llama", "device": "cpu", **args})


def test_model_arguments_are_typed_and_lm_evals_own_pass_through():
    lm = ElasticLM(pretrained="tiny:llama", method="streaming", method_sparse_decode="no", method_local="16",
                   backend="causal", dtype="auto", device=None)
    try:
        assert lm.method.sparse_decode is False and lm.method.local == 16 and lm.backend == "causal"
    finally:
        lm.close()


def test_lm_eval_discovers_elastic_through_its_entry_point():
    # lm-eval releases with EleutherAI/lm-evaluation-harness#4013 register each entry point of the group
    # `lm_eval.models` as a lazy placeholder of their model registry; this does what that discovery does, with the
    # entry points this installation declares (pyproject.toml).
    found = {point.name: point for point in importlib.metadata.entry_points(group="lm_eval.models")}
    assert found["elastic"].value == "elastic_bench.evaluation.lm_eval_bridge:ElasticLM"
    registry = Registry("model")
    registry.register("elastic", target=found["elastic"])
    assert registry.get("elastic") is ElasticLM


def test_importing_the_bridge_registers_elastic_for_lm_evals_python_api_and_elastic_bench_installs_no_hook():
    code = (
        "import sys, elastic_bench\n"
        "assert 'lm_eval' not in sys.modules and 'torch' not in sys.modules\n"
        "assert not any('elastic_bench' in type(finder).__module__ for finder in sys.meta_path)\n"
        "from lm_eval.api.registry import get_model\n"
        "import elastic_bench.evaluation.lm_eval_bridge\n"
        "from lm_eval.models.huggingface import HFLM\n"
        "assert get_model('elastic').__name__ == 'ElasticLM' and get_model('hf') is HFLM\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_importing_the_bridge_changes_no_attribute_of_lm_eval_and_adds_only_elastic_to_its_model_registry():
    """Every attribute of every lm-eval module (and of every class such a module defines) keeps its value when the
    bridge is imported; the one change allowed is the registry addition (lm-eval's public extension point), named
    here: ``model_registry`` gains ``elastic`` → `ElasticLM` (or has its entry-point placeholder resolved to it)."""
    code = (
        "import inspect, sys\n"
        "import lm_eval, lm_eval.evaluator, lm_eval.loggers, lm_eval.models.huggingface, lm_eval.models.utils\n"
        "import lm_eval.api.model, lm_eval.api.registry, lm_eval.config.evaluate_config, lm_eval._cli, lm_eval.utils\n"
        "from lm_eval.api.registry import model_registry\n"
        "def snapshot():\n"
        "    seen = {}\n"
        "    for name, module in list(sys.modules.items()):\n"
        "        if name.split('.')[0] != 'lm_eval' or module is None:\n"
        "            continue\n"
        "        for attr, value in list(vars(module).items()):\n"
        "            seen[f'{name}.{attr}'] = id(value)\n"
        "            if inspect.isclass(value) and value.__module__.split('.')[0] == 'lm_eval':\n"
        "                for key, member in list(vars(value).items()):\n"
        "                    seen[f'{name}.{attr}.{key}'] = id(member)\n"
        "    return seen\n"
        "before, registry = snapshot(), dict(model_registry.items())\n"
        "import elastic_bench.evaluation.lm_eval_bridge as bridge\n"
        "after = snapshot()\n"
        "changed = sorted(k for k in before if after.get(k) != before[k])\n"
        "assert not changed, changed\n"
        "added = {k: v for k, v in model_registry.items() if registry.get(k) is not v}\n"
        "assert added == {'elastic': bridge.ElasticLM}, added\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
