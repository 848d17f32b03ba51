"""DuoAttention's and PruLong's chunked-prefill deployments.

Kernel level: the chunked streaming geometry (`StreamingGeometry.chunk_starts`) on every CPU backend against the
rule its docstring states, evaluated here as a dense mask, and its pair counts against a brute-force count of that
mask (the Triton backends in a child process under ``TRITON_INTERPRET=1``, see tests/test_kernels_triton.py).
Model level: ``duo_attention`` / ``prulong`` with ``prefill="chunked"`` or ``"longbench"``, one forward through
`elastic_bench.apply`, against upstream's deployment written out as a loop over chunks: each chunk is fed with a
cache, and an attention function of this file keeps the streaming heads' cache truncated to the first ``sink`` +
last ``recent`` tokens after every forward, as DuoAttention's ``duo_attn/patch/llama.py`` does.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_kernels_triton import print_case_results, run_interpreted

from elastic_bench import apply, get_method
from elastic_bench.kernels import HeadPlan, Mode, StreamingGeometry, available_backends, hybrid_attention, pair_counts
from elastic_bench.kernels.hybrid.masks import streaming as streaming_mask
from elastic_bench.kernels.hybrid.naive import naive_hybrid_attention
from elastic_bench.modeling.attention import attention_implementation

# name: (batch, kv heads, groups, Lq, Lk, modes per (sample, KV head) (F/S), sink, local, chunk starts)
CASES = {
    "chunks": (1, 2, 2, 90, 90, "FS", 3, 8, (0, 24, 48, 72)),
    "sink_window_overlap": (1, 2, 1, 90, 90, "SS", 6, 4, (0, 5, 9, 40, 41)),  # 9 - 4 < 6: that chunk is dense
    "caller_fed_chunk": (2, 2, 2, 37, 90, "FSSF", 3, 8, (0, 24, 48, 72)),  # its queries start inside a chunk
    "decode_row": (1, 2, 2, 1, 90, "SF", 3, 8, (0, 24, 48, 72)),
    "one_chunk": (1, 2, 2, 90, 90, "SS", 3, 8, (0,)),
    "longbench_like": (1, 2, 2, 90, 90, "SF", 2, 10, (0, *range(70, 90))),
}


def visible(p: int, j: int, sink: int, local: int, starts: tuple[int, ...]) -> bool:
    """The rule of `StreamingGeometry.chunk_starts`, read literally."""
    s = max(start for start in starts if start <= p)
    return j <= p and (j < sink or j >= s - local)


def _case(name: str):
    B, H, G, Lq, Lk, modes, sink, local, starts = CASES[name]
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    q = torch.randn(B, H * G, Lq, 16, generator=gen)
    k, v = (torch.randn(B, H, Lk, 16, generator=gen) for _ in "kv")
    codes = torch.tensor(["FS".index(m) for m in modes], dtype=torch.uint8).view(B, H)
    return q, k, v, HeadPlan(codes, StreamingGeometry(sink, local, chunk_starts=starts))


def dense_definition(q, k, v, plan: HeadPlan) -> torch.Tensor:
    """Every head through SDPA with its mask built pair by pair from `visible` (FULL heads: causal)."""
    B, Hq, Lq, _ = q.shape
    H, Lk = k.shape[1], k.shape[2]
    geo = plan.streaming
    rule = torch.tensor([[visible(p, j, geo.sink, geo.local, geo.chunk_starts) for j in range(Lk)]
                         for p in range(Lk - Lq, Lk)])
    causal = torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq)
    out = torch.empty_like(q)
    for b in range(B):
        for h, mode in enumerate(plan.modes[b].tolist()):
            rows = slice(h * (Hq // H), (h + 1) * (Hq // H))
            mask = rule if mode == Mode.STREAMING else causal
            out[b, rows] = F.scaled_dot_product_attention(q[b, rows], k[b, h:h + 1], v[b, h:h + 1], attn_mask=mask)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_mask_and_pair_counts_follow_the_rule(name):
    q, k, v, plan = _case(name)
    Lq, Lk, geo = q.shape[2], k.shape[2], plan.streaming
    q_pos, kv_pos = torch.arange(Lk - Lq, Lk)[:, None], torch.arange(Lk)[None, :]
    mask = streaming_mask(geo)(q_pos, kv_pos)
    rule = [[visible(p, j, geo.sink, geo.local, geo.chunk_starts) for j in range(Lk)] for p in range(Lk - Lq, Lk)]
    assert mask.tolist() == rule
    counts = pair_counts(plan, Lq, Lk, q.shape[1])
    streaming = plan.modes == Mode.STREAMING
    assert counts.attended[streaming].eq(float(mask.sum())).all()
    assert counts.attended[~streaming].eq(float(counts.causal)).all()
    assert counts.attended_last[streaming].eq(float(mask[-1].sum())).all()


@pytest.mark.parametrize("name", list(CASES))
def test_every_cpu_backend_equals_the_dense_definition(name, monkeypatch):
    """The reference evaluates the rule as a mask; every other backend runs the per-chunk dense calls
    (`chunked.chunked_hybrid_attention`), here also through the reference's dense path (a stand-in registered without
    ``native_chunks``)."""
    from elastic_bench.kernels import hybrid

    monkeypatch.setattr(hybrid, "_BACKENDS", dict(hybrid._BACKENDS))
    hybrid.register_backend("per_chunk", naive_hybrid_attention, lambda device: True, priority=-1)
    q, k, v, plan = _case(name)
    expected = dense_definition(q, k, v, plan)
    for backend in available_backends("cpu"):
        out = hybrid_attention(q, k, v, plan, backend=backend)
        assert (out - expected).abs().max() < 1e-5, backend


def _run_interpreted_case(name: str) -> dict:
    q, k, v, plan = _case(name)
    expected = dense_definition(q, k, v, plan)
    return {b: float((hybrid_attention(q, k, v, plan, backend=b) - expected).abs().max())
            for b in available_backends("cpu")}


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(__file__)


def test_triton_backends_equal_the_dense_definition(interpreted):
    for name, result in interpreted.items():
        assert "error" not in result, f"{name}: {result.get('error')}"
        assert {"triton", "split"} <= set(result), name
        assert max(result.values()) < 1e-4, (name, result)


@pytest.mark.gpu
def test_gpu_backends_equal_the_dense_definition():
    for name in CASES:
        q, k, v, plan = _case(name)
        expected = dense_definition(q, k, v, plan).cuda()
        q, k, v = (t.cuda().to(torch.bfloat16) for t in (q, k, v))
        for backend in available_backends("cuda"):
            out = hybrid_attention(q, k, v, plan, backend=backend).float()
            assert (out - expected).abs().max() < 3e-2, (name, backend)


def test_invalid_chunked_geometries_are_rejected():
    from elastic_bench.kernels import BlockSelection
    from elastic_bench.kernels.hybrid.fused import streaming_params

    with pytest.raises(ValueError, match="start at 0"):
        StreamingGeometry(4, 8, chunk_starts=(5, 9))
    with pytest.raises(ValueError, match="ascend strictly"):
        StreamingGeometry(4, 8, chunk_starts=(0, 9, 9))
    with pytest.raises(ValueError, match="token-granular"):
        StreamingGeometry(4, 8, "block", chunk_starts=(0, 9))
    geometry = StreamingGeometry(4, 8, chunk_starts=(0, 9))
    blocks = BlockSelection.from_dense(torch.ones(1, 1, 1, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="FULL heads only"):
        HeadPlan(torch.tensor([[2]], dtype=torch.uint8), geometry, blocks)
    with pytest.raises(ValueError, match="chunk by chunk"):  # a backend function called directly
        streaming_params(HeadPlan(torch.tensor([[1]], dtype=torch.uint8), geometry))


# ---- model level: one forward against upstream's loop over chunks --------------------------------------------------

LOOP = "_test_chunked_prefill_loop"
SINK, RECENT, CHUNK, LENGTH = 4, 16, 32, 150
GATES = np.array([[1.0, 0.1], [0.2, 0.9]])  # streaming: layer 0 KV head 1, layer 1 KV head 0


class UpstreamLoop:
    """DuoAttention's deployment as an attention function: retrieval heads attend the whole cache; streaming heads
    attend their own cache plus the call's tokens, and that cache keeps the first ``sink`` + last ``recent`` tokens
    after every forward (positions keep their RoPE). Counts the pairs each head computes."""

    def __init__(self, streaming: torch.Tensor, sink: int, recent: int):
        self.streaming, self.sink, self.recent = streaming, sink, recent  # streaming: bool [layers, KV heads]
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.attended = torch.zeros(streaming.shape, dtype=torch.float64)
        self.causal = torch.zeros(streaming.shape, dtype=torch.float64)

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        layer, Lq = module.layer_idx, query.shape[2]
        H = key.shape[1]
        G = query.shape[1] // H
        past = self.cache.get(layer, (key[:, :, :0], value[:, :, :0]))
        stream_k, stream_v = (torch.cat([old, new[:, :, -Lq:]], dim=2) for old, new in zip(past, (key, value)))
        out = []
        for h in range(H):
            keys, values = (stream_k, stream_v) if self.streaming[layer, h] else (key, value)
            Lk = keys.shape[2]
            mask = torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq)  # causal, bottom-right (flash_attn_func)
            out.append(F.scaled_dot_product_attention(
                query[:, h * G:(h + 1) * G], keys[:, h:h + 1].expand(-1, G, -1, -1),
                values[:, h:h + 1].expand(-1, G, -1, -1), attn_mask=mask, scale=scaling))
            self.attended[layer, h] += float(mask.sum())
            self.causal[layer, h] += Lq * (key.shape[2] - Lq) + Lq * (Lq + 1) // 2
        if stream_k.shape[2] > self.sink + self.recent:
            stream_k, stream_v = (torch.cat([t[:, :, :self.sink], t[:, :, -self.recent:]], dim=2)
                                  for t in (stream_k, stream_v))
        self.cache[layer] = (stream_k, stream_v)
        return torch.cat(out, dim=1).transpose(1, 2), None

    def omega_esr(self) -> float:
        return float((1 - self.attended / self.causal).mean())


def upstream_logits(model, ids: torch.Tensor, starts: list[int], loop: UpstreamLoop) -> torch.Tensor:
    """Logits ``[1, L, V]`` of ``ids`` fed chunk by chunk (chunks from ``starts``) with a cache."""
    from transformers import AttentionInterface, DynamicCache

    AttentionInterface.register(LOOP, loop)
    cache, logits = DynamicCache(), []
    with torch.no_grad(), attention_implementation(model, LOOP):
        for start, end in zip(starts, [*starts[1:], ids.shape[1]]):
            logits.append(model(ids[:, start:end], None, None, cache, use_cache=True).logits)  # as generation.py
    return torch.cat(logits, dim=1)


# What upstream's evaluation scripts feed, written out from them: DuoAttention's eval/needle/needle_in_haystack.py
# (chunks of --prefilling_chunk_size), PruLong's eval/model_utils.py (chunks of input_ids[..., :-1], then generate()
# feeds the last token), DuoAttention's eval/LongBench/pred.py (ids[:, :-50], then the last 50 one at a time).
DEPLOYMENTS = {
    "duo_chunked": ("duo_attention", {"prefill": "chunked", "chunk_size": CHUNK}, [*range(0, LENGTH, CHUNK)]),
    "prulong_chunked": ("prulong", {"prefill": "chunked", "chunk_size": CHUNK},
                        [*range(0, LENGTH - 1, CHUNK), LENGTH - 1]),
    "duo_longbench": ("duo_attention", {"prefill": "longbench"}, [0, *range(LENGTH - 50, LENGTH)]),
}


@pytest.fixture(scope="module")
def gate_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gates") / "full_attention_heads.tsv"
    np.savetxt(path, GATES, delimiter="\t", fmt="%.18e")
    return str(path)


def _prompt(model) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (1, LENGTH), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("deployment", list(DEPLOYMENTS))
def test_one_forward_equals_upstreams_loop_over_chunks(tiny_models, gate_file, arch, deployment, monkeypatch):
    """Logits and greedy tokens at every prompt position, and ΩESR, on the reference backend and through the
    per-chunk dense calls every other backend runs (a stand-in without ``native_chunks``)."""
    from elastic_bench.kernels import hybrid

    model, _ = tiny_models[arch]
    name, options, starts = DEPLOYMENTS[deployment]
    ids = _prompt(model)
    loop = UpstreamLoop(torch.from_numpy(GATES < 0.5), SINK, RECENT)
    expected = upstream_logits(model, ids, starts, loop)
    method = get_method(name, pattern=gate_file, sparsity=None, sink=SINK, local=RECENT, **options)
    monkeypatch.setattr(hybrid, "_BACKENDS", dict(hybrid._BACKENDS))
    hybrid.register_backend("per_chunk", naive_hybrid_attention, lambda device: True, priority=-1)
    for backend in ("reference", "per_chunk"):
        with torch.no_grad(), apply(method, model, backend=backend) as handle:
            logits = model(ids).logits
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
        assert torch.equal(logits.argmax(-1), expected.argmax(-1))
        assert handle.stats()["omega_msr"] == 0.5
        assert handle.stats()["omega_esr"] == pytest.approx(loop.omega_esr(), abs=1e-12)
    assert loop.omega_esr() > 0.05  # the later chunks' streaming heads skip pairs


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_one_chunk_covering_the_prompt_equals_full(tiny_models, gate_file, arch):
    model, _ = tiny_models[arch]
    ids = _prompt(model)
    with torch.no_grad():
        with apply(get_method("full"), model):
            full = model(ids).logits
        method = get_method("duo_attention", pattern=gate_file, sink=SINK, local=RECENT, prefill="chunked",
                            chunk_size=LENGTH)
        with apply(method, model) as handle:
            chunked = model(ids).logits
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-5)
    assert handle.stats()["omega_esr"] == 0.0 and handle.stats()["omega_msr"] == 0.5


def test_decode_steps_see_the_cached_window_and_the_query(tiny_models, gate_file):
    """After a chunked prefill a decode step sees upstream's compressed cache (sink + `local` tokens) and itself."""
    from elastic_bench.modeling.interface import AttentionCall

    model, _ = tiny_models["llama"]
    method = get_method("duo_attention", pattern=gate_file, sink=SINK, local=RECENT, prefill="chunked", chunk_size=8)
    method.setup(model)
    module = model.model.layers[0].self_attn
    q, kv = torch.zeros(1, 4, 1, 16), torch.zeros(1, 2, 40, 16)
    assert method.plan(AttentionCall(module, q, kv, kv)).streaming == StreamingGeometry(SINK, RECENT + 1)
    chunk = method.plan(AttentionCall(module, q.expand(-1, -1, 40, -1), kv, kv)).streaming
    assert chunk.chunk_starts == (0, 8, 16, 24, 32)


def test_prefill_knobs_are_validated():
    with pytest.raises(ValueError, match="prefill must be one of"):
        get_method("duo_attention", prefill="streamed")
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        get_method("prulong", chunk_size=0)
    assert get_method("prulong").chunk_size == 32768 and get_method("duo_attention").chunk_size == 32000


if __name__ == "__main__":  # the child process of `interpreted`: TRITON_INTERPRET=1 makes Triton available on the CPU
    assert os.environ.get("TRITON_INTERPRET") == "1"
    print_case_results(CASES, _run_interpreted_case)
