"""Batched generation gives batch 1's results: every method's tokens, per-sample ΩMSR / ΩESR, per-layer decisions and
KV bytes, for prompts of different lengths routed differently in one batch and finishing at different steps; `run
--batch-size` records the same predictions and scores, times its prefills on the prompts run alone; decode graphs are
captured once per batch shape over caches that keep their addresses."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from elastic_bench import apply, get_method, tasks
from elastic_bench.evaluation.runner import RunConfig, run
from elastic_bench.modeling import generation
from elastic_bench.modeling.loading import load_model
from elastic_bench.results.store import Cell
from elastic_bench.testbed import STREAMING_LOCAL, STREAMING_SINK

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

WINDOW = {"sink": STREAMING_SINK, "local": STREAMING_LOCAL}  # shorter than the prompts: eviction matters
# Every registered method; the gated ones read the testbed's shipped gates, elastic its shipped router.
METHODS = {
    "full": {},
    "streaming": {**WINDOW, "sparse_decode": True},
    "duo_attention": WINDOW,
    "prulong": WINDOW,
    "xattention": {},
    "elastic": {**WINDOW, "sparse_decode": True},
    # the top-k block methods with a free block or chunk or two per query block on these ~500-token prompts
    "infllm_v2": {"dense_len": 0, "topk": 3, "window_size": 64},
    "moba": {"chunk_size": 128, "topk": 2, "block_size": 32},
    "nsa": {"topk": 4},
}
TOPK = ("infllm_v2", "moba", "nsa")  # their decode steps are full attention's: the decode-graph test skips them
TIMING = ("prefill_seconds", "prefill_parts", "decode_seconds", "decode_ms_per_token", "batch_size",
          "generation_seconds", "line_sha256")  # a line's seal covers its timing


@pytest.fixture(scope="module")
def testbed():
    """The testbed model and two prompts each of a sensitive task (answers of 5 tokens) and a robust one (7 tokens),
    at two lengths (496 and 624 tokens)."""
    model, tokenizer = load_model("testbed", dtype=torch.float32, device="cpu")
    samples = (tasks.get("testbed_niah_single").samples(tokenizer, 512, limit=2, seed=0)
               + tasks.get("testbed_repeat").samples(tokenizer, 640, limit=2, seed=0))
    return model, tokenizer, samples


def alone_and_batched(model, method, samples, stops, graphs=False):
    """Per sample: (tokens, kv bytes, kv bytes full, its ``per_sample`` statistics, its decisions) generated alone,
    and the same from one batch of all samples; and the rows of each forward of the batch."""
    found, rows = [], []
    with torch.no_grad(), apply(method, model) as handle:
        for sample in samples:
            handle.reset()
            gen = generation.greedy_generate(model, sample.input_ids, sample.max_new_tokens, stops)
            found.append((gen.tokens, gen.kv_bytes, gen.kv_bytes_full, handle.stats()["per_sample"][0],
                          handle.decisions()[0].tolist()))
        handle.reset()
        hook = model.register_forward_pre_hook(lambda _, __, kwargs: rows.append(kwargs["input_ids"].shape[0]),
                                               with_kwargs=True)
        try:
            batch = generation.generate(model, [s.input_ids for s in samples], [s.max_new_tokens for s in samples],
                                        [stops] * len(samples), decode_graphs=graphs)
        finally:
            hook.remove()
        stats, decisions = handle.stats(), handle.decisions()
    batched = [(row.tokens, row.kv_bytes, row.kv_bytes_full, stats["per_sample"][i], decisions[i].tolist())
               for i, row in enumerate(batch.rows)]
    return found, batched, rows


@pytest.mark.parametrize("name", list(METHODS))
def test_a_batch_gives_every_sample_its_batch_1_results(testbed, name):
    model, tokenizer, samples = testbed
    alone, batched, rows = alone_and_batched(model, get_method(name, **METHODS[name]), samples,
                                             {tokenizer.eos_token_id})
    assert batched == alone  # tokens, bytes and sparsity compared exactly
    assert len({len(s.input_ids) for s in samples}) == 2  # prompts of two lengths in the batch
    assert [len(tokens) for tokens, *_ in alone] == [5, 5, 7, 7]  # then the end-of-sequence token
    assert rows == [4] + [4] * 5 + [2] * 2  # the prefill, then decode steps without the rows that finished
    if name in ("streaming", "prulong", "elastic"):  # nearly every head keeps sink + window only: eviction bites
        assert all(held < 0.9 * full for _, held, full, *_ in alone)
    if name == "elastic":  # the shipped router routes the sensitive and the robust prompts differently
        assert alone[0][4] != alone[2][4] and alone[0][3]["omega_msr"] != alone[2][3]["omega_msr"]


def test_a_batched_run_records_batch_1s_predictions_and_times_its_prefills_alone(tmp_path):
    base = dict(model="testbed", methods=["full", "elastic"], tasks=["testbed_niah_single", "testbed_repeat"],
                lengths=[640], limit=5, progress=False, device="cpu", method_options={"elastic": METHODS["elastic"]},
                allow_in_distribution=True)  # the shipped router was trained on the testbed's tasks
    run(RunConfig(**base, output=str(tmp_path / "one")))
    run(RunConfig(**base, output=str(tmp_path / "four"), batch_size=4, timed_samples=1))
    msr = set()
    for method in ("full", "elastic-sink=16-local=256-sparse_decode=True"):
        for task in base["tasks"]:
            one, four = (Cell(tmp_path / out, "testbed", method, task, 640) for out in ("one", "four"))
            records = {out: cell.predictions() for out, cell in (("one", one), ("four", four))}
            assert [{k: v for k, v in r.items() if k not in TIMING} for r in records["four"]] == \
                [{k: v for k, v in r.items() if k not in TIMING} for r in records["one"]]
            assert [r["batch_size"] for r in records["four"]] == [1, 4, 4, 4, 4]
            assert [r["prefill_seconds"] is None for r in records["four"]] == [False] + [True] * 4
            metrics = {out: cell.metrics() for out, cell in (("one", one), ("four", four))}
            assert metrics["four"]["score"] == metrics["one"]["score"]
            assert metrics["four"]["prefill_seconds_median"] == records["four"][0]["prefill_seconds"]
            assert (metrics["four"]["prefill_samples"], metrics["four"]["batch_size_used"]) == (1, 4)
            assert metrics["four"]["samples_per_second"] > 0 and "samples_per_second" not in metrics["one"]
            assert json.loads((four.dir / "config.json").read_text())["batch_size"] == 4
            msr.add(metrics["four"]["omega_msr"])
    assert len(msr) > 2  # the sparse method routes the two tasks differently


def _addresses(cache) -> list:
    """Where every tensor a decode step reads lives, and the decode kernels' host integers, layer by layer."""
    found = []
    for layer in cache.layers:
        kv, rule = layer.packed, layer.rule
        tensors = (kv.keys, kv.values, kv.positions, kv.offsets, kv.slots, kv.window_start, kv.sink_end, layer.newest,
                   rule.ring, rule.streaming)
        found.append([t.data_ptr() for t in tensors] + [kv.max_slots, kv.long_rows, rule.ring_sink, rule.ring_span,
                                                         rule.quantum, rule.back])
    return found


class EagerGraph:
    """A stand-in for `DecodeGraph` on the CPU: each step runs eagerly, after checking that the cache's tensors are
    where they were at capture, as a CUDA graph's replay needs them."""

    def __init__(self, model, cache, positions, rows):
        self.model, self.cache, self.positions = model, cache, positions.clone()
        self.captured = _addresses(cache)

    def restart(self, positions):
        self.positions = positions.clone()

    def step(self, tokens):
        assert _addresses(self.cache) == self.captured, "a tensor the graph reads moved"
        logits = generation._forward(self.model, tokens[:, None], self.cache, position_ids=self.positions[:, None])[0]
        self.positions = self.positions + 1
        return logits


@pytest.mark.parametrize("name", [m for m in METHODS if m not in TOPK])
def test_decode_graphs_are_captured_once_per_batch_shape(testbed, name, monkeypatch):
    """A cell's warm-ups capture the graphs of a batch of one and, on a short prompt, of a batch of two; its prompts
    alone, two batches of two (a batch of one row after another, of prompts routed differently) and a last batch of
    one prompt in the shape of two replay them without capturing again, and every prompt gets the tokens and cache
    bytes of eager decoding; the rows named timed, and only they, have their prefill's seconds."""
    model, tokenizer, samples = testbed
    monkeypatch.setattr(generation, "fused_ops", lambda model: contextlib.nullcontext())
    captures = []

    def capture(*args):
        captures.append(args[-1])
        return EagerGraph(*args)

    method = get_method(name, **METHODS[name])
    stops = {tokenizer.eos_token_id}
    eager, _, _ = alone_and_batched(model, method, samples, stops)
    graphs = generation.DecodeGraphs(max(len(s.input_ids) + s.max_new_tokens for s in samples), capture=capture)
    with torch.no_grad(), apply(method, model):
        generation.warm_up(model, samples[0].input_ids, graphs)
        generation.warm_up(model, samples[0].input_ids[:64], graphs, rows=2)
        assert captures == [1, 2]
        alone = [generation.greedy_generate(model, s.input_ids, s.max_new_tokens, stops, decode_graphs=graphs)
                 for s in samples]
        batches = [generation.generate(model, [s.input_ids for s in group], [s.max_new_tokens for s in group],
                                       [stops] * len(group), decode_graphs=graphs, timed=timed, rows=2)
                   for group, timed in ((samples[:2], [True, False]), (samples[1:3], None), (samples[3:], [False]))]
    assert captures == [1, 2] and graphs.captured == [(1, graphs.row_slots), (2, graphs.row_slots)]
    assert [(g.tokens, g.kv_bytes, g.kv_bytes_full) for g in alone] == [e[:3] for e in eager]
    rows = [row for batch in batches for row in batch.rows]
    assert [(r.tokens, r.kv_bytes, r.kv_bytes_full) for r in rows] == \
        [e[:3] for e in eager[:2] + eager[1:3] + eager[3:]]
    assert [r.prefill_seconds is not None for r in rows] == [True, False, False, False, False]
    assert rows[0].prefill_seconds > 0 and all(g.prefill_seconds > 0 for g in alone)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["duo_attention", "elastic"])
def test_decode_graphs_replay_over_later_batches_on_the_gpu(name):
    """CUDA graphs captured once per batch shape, replayed over later prompts and batches, give the tokens and cache
    bytes of eager decoding (fp32, the testbed)."""
    model, tokenizer = load_model("testbed", dtype=torch.float32, device="cuda")
    samples = (tasks.get("testbed_niah_single").samples(tokenizer, 512, limit=2, seed=0)
               + tasks.get("testbed_repeat").samples(tokenizer, 640, limit=2, seed=0))
    method, stops = get_method(name, **METHODS[name]), {tokenizer.eos_token_id}
    pairs = (samples[:2], samples[2:], samples[1:3])
    found = {}
    for graphs in (False, generation.DecodeGraphs(max(len(s.input_ids) + s.max_new_tokens for s in samples))):
        with torch.no_grad(), apply(method, model):
            if graphs:
                generation.warm_up(model, samples[0].input_ids, graphs)
            alone = [generation.greedy_generate(model, s.input_ids, s.max_new_tokens, stops, decode_graphs=graphs)
                     for s in samples]
            batched = [row for pair in pairs for row in generation.generate(
                model, [s.input_ids for s in pair], [s.max_new_tokens for s in pair], [stops] * 2,
                decode_graphs=graphs).rows]
        found[bool(graphs)] = ([(g.tokens, g.kv_bytes, g.kv_bytes_full) for g in alone],
                               [(r.tokens, r.kv_bytes, r.kv_bytes_full) for r in batched])
    assert found[True] == found[False] and found[False][0] == [found[False][1][i] for i in (0, 1, 2, 3)]
    assert graphs.captured == [(1, graphs.row_slots), (2, graphs.row_slots)]


@pytest.mark.gpu
def test_a_batched_run_with_decode_graphs_gives_batch_1s_predictions_on_the_gpu(tmp_path):
    base = dict(model="testbed", methods=["full", "elastic"], tasks=["testbed_niah_single", "testbed_repeat"],
                lengths=[640], limit=6, progress=False, dtype="float32", method_options={"elastic": METHODS["elastic"]},
                allow_in_distribution=True)  # the shipped router was trained on the testbed's tasks
    run(RunConfig(**base, output=str(tmp_path / "one")))
    run(RunConfig(**base, output=str(tmp_path / "four"), batch_size=4, timed_samples=1, decode_graphs=True))
    for method in ("full", "elastic-sink=16-local=256-sparse_decode=True"):
        for task in base["tasks"]:
            one, four = (Cell(tmp_path / out, "testbed", method, task, 640) for out in ("one", "four"))
            assert four.metrics()["status"] == "complete", four.metrics().get("error")
            assert [{k: v for k, v in r.items() if k not in TIMING} for r in four.predictions()] == \
                [{k: v for k, v in r.items() if k not in TIMING} for r in one.predictions()]
            assert [r["batch_size"] for r in four.predictions()] == [3] * 6  # two even batches, the first row timed
            assert [r["prefill_seconds"] is None for r in four.predictions()] == [False] + [True] * 5


def test_the_memory_probe_fills_a_static_cache_of_its_own(testbed):
    """`fitting_batch` with decode graphs probes with a cache of its own (copies of one packed prompt, a prefill beside
    them, a decode step over them) and leaves the cell's graphs without caches: on the CPU every batch fits."""
    model, _, samples = testbed
    graphs = generation.DecodeGraphs(len(samples[0].input_ids) + 8)
    with torch.no_grad(), apply(get_method("streaming", **WINDOW), model):
        assert generation.fitting_batch(model, samples[0].input_ids, 3, graphs) == 3
    assert graphs.caches == {} and graphs.captured == []
