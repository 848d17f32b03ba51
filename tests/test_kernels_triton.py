"""The fused Triton kernel (``triton``) and ``split`` against ``reference``, on the CPU under ``TRITON_INTERPRET=1``.

Triton decides at decoration time whether kernels are interpreted, and interpretation must not leak into other tests
(it would make Triton "available" on the CPU), so the cases run in one child process (this file run as a script) and
each test asserts on its case's result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

# name: (batch, kv heads, groups, Lq, Lk, head_dim, modes per (sample, KV head), geometry, block size, dtype, config)
# config: (block_m, block_n, warps, stages, tma) or None for the default of the head dim.
CASES = {
    "full_gqa4_d64": (1, 2, 4, 200, 200, 64, "FF", ("token", 16, 40), 64, "float32", None),
    "streaming_token_gqa1_d128": (1, 2, 1, 177, 177, 128, "SS", ("token", 5, 33), 64, "float32", (32, 16, 4, 1, False)),
    "streaming_token_anchored_gqa4": (1, 2, 4, 400, 400, 32, "SS", ("token", 8, 128), 64, "float32",
                                      (64, 32, 4, 1, True)),
    "streaming_token_anchored_fp16": (1, 2, 4, 700, 700, 128, "SF", ("token", 64, 256), 64, "float16", None),
    "streaming_block_gqa4": (1, 2, 4, 300, 300, 32, "SS", ("block", 32, 64), 32, "float32", (32, 16, 4, 1, False)),
    "sparse_gqa1_d64": (2, 1, 1, 150, 150, 64, "BB", ("token", 8, 8), 32, "float32", (32, 16, 4, 1, True)),
    "full_streaming_q_shorter": (1, 2, 4, 77, 333, 32, "FS", ("token", 5, 50), 64, "float32", (64, 32, 4, 1, False)),
    "full_sparse_gqa4_d128": (1, 2, 4, 250, 250, 128, "FB", ("token", 16, 40), 64, "float32", None),
    "streaming_sparse_q_shorter": (1, 2, 2, 96, 320, 64, "BS", ("block", 32, 96), 32, "float32", (32, 32, 4, 1, True)),
    "three_way_per_sample": (2, 3, 2, 261, 261, 16, "FSBBFS", ("token", 20, 70), 32, "float32", (32, 16, 4, 1, True)),
    "three_way_fp16_tma": (1, 3, 4, 300, 300, 64, "SBF", ("block", 64, 128), 64, "float16", None),
    "decode_row": (1, 2, 4, 1, 300, 32, "FS", ("token", 16, 64), 64, "float32", None),
    "block_sparse_subblocks": (1, 1, 4, 270, 270, 32, "B", ("token", 1, 1), 64, "float32", (64, 16, 4, 1, False)),
}


def _plan(B, H, Hq, Lk, modes, geometry, block_size, gen):
    from elastic_bench.kernels import BlockSelection, HeadPlan, StreamingGeometry

    codes = torch.tensor(["FSB".index(m) for m in modes], dtype=torch.uint8).view(B, H)
    n = -(-Lk // block_size)
    r, c = torch.arange(n)[:, None], torch.arange(n)[None, :]
    dense = (torch.rand(B, Hq, n, n, generator=gen) < 0.4) & (c <= r)
    dense |= (torch.rand(B, Hq, n, 1, generator=gen) < 0.7) & (c == r)  # diagonal usually kept
    dense[..., 1, :] = False  # an empty row: its queries output zeros
    dense[..., -1, -1] = True
    dense[..., 2, n - 1] = n > 3  # a listed block above the diagonal, never computed
    granularity, sink, local = geometry
    return HeadPlan(codes, StreamingGeometry(sink, local, granularity), BlockSelection.from_dense(dense), block_size)


def _run_case(name: str) -> dict:
    from elastic_bench.kernels import hybrid_attention
    from elastic_bench.kernels.hybrid.fused import TileConfig, triton_hybrid_attention

    B, H, G, Lq, Lk, D, modes, geometry, bs, dtype, config = CASES[name]
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    Hq = H * G
    dtype = getattr(torch, dtype)
    q = torch.randn(B, Hq, Lq, D, generator=gen).to(dtype)
    k = torch.randn(B, H, Lk, D, generator=gen).to(dtype)
    v = torch.randn(B, H, Lk, D, generator=gen).to(dtype)
    if name == "full_gqa4_d64":  # non-contiguous inputs, as the model's transposed projections
        q = torch.randn(B, Lq, Hq, D, generator=gen).transpose(1, 2)
    plan = _plan(B, H, Hq, Lk, modes, geometry, bs, gen)
    ref = hybrid_attention(q.float(), k.float(), v.float(), plan, backend="reference")
    cfg = TileConfig(*config) if config else None
    fused = triton_hybrid_attention(q, k, v, plan, D**-0.5, config=cfg)
    split = hybrid_attention(q, k, v, plan, backend="split")
    return {
        "fused": float((fused.float() - ref).abs().max()),
        "split": float((split.float() - ref).abs().max()),
        "finite": bool(torch.isfinite(fused).all()),
        "tol": 1e-4 if dtype == torch.float32 else 2e-2,
    }


def run_interpreted(script: str) -> dict:
    """Run a test file as a script under ``TRITON_INTERPRET=1``, on one thread (the test suite's: `conftest`; here 35 s
    of user time against 58 on two); it prints its case results as one JSON line."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def print_case_results(cases, run_case) -> None:
    """The script side of `run_interpreted`: every case's result, or its error, as one JSON line."""
    out = {}
    for case in cases:
        try:
            out[case] = run_case(case)
        except Exception as err:  # reported per case by the tests
            out[case] = {"error": f"{type(err).__name__}: {err}"}
    print(json.dumps(out))


@pytest.fixture(scope="module")
def results() -> dict:
    return run_interpreted(__file__)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_triton_matches_reference(results, name):
    r = results[name]
    assert "error" not in r, r.get("error")
    assert r["finite"]
    assert r["fused"] < r["tol"], f"fused kernel differs from reference by {r['fused']}"
    assert r["split"] < r["tol"], f"split backend differs from reference by {r['split']}"


def test_streaming_only_launches_take_their_own_tile_shape():
    from elastic_bench.kernels import HeadPlan, Mode, StreamingGeometry
    from elastic_bench.kernels.hybrid.fused import CONFIGS, STREAMING_CONFIGS, _config

    q = torch.empty(1, 8, 16, 128, dtype=torch.bfloat16)
    token = HeadPlan.uniform(Mode.STREAMING, 1, 2, streaming=StreamingGeometry(4, 8, "token"))
    block = HeadPlan.uniform(Mode.STREAMING, 1, 2, streaming=StreamingGeometry(128, 1024, "block"))
    assert _config(q, token, None, skip_full=True) == STREAMING_CONFIGS[128] != CONFIGS[128]
    assert _config(q, token, None, skip_full=False) == CONFIGS[128]  # FULL tiles in the launch too
    assert _config(q, block, None, skip_full=True) == CONFIGS[128]  # block geometry: aligned tiles
    assert _config(q.float(), token, None, skip_full=True).block_n == STREAMING_CONFIGS[128].block_n // 2


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", ["block", "token"])  # token: anchored streaming tiles
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_backends_match_reference(head_dim, granularity):
    from elastic_bench.kernels import hybrid_attention

    gen = torch.Generator(device="cuda").manual_seed(head_dim)
    B, H, G, Lk = 2, 4, 4, 3000
    for Lq in (Lk, 1000):
        q = torch.randn(B, H * G, Lq, head_dim, device="cuda", generator=gen, dtype=torch.bfloat16)
        k, v = (torch.randn(B, H, Lk, head_dim, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in "kv")
        plan = _plan(B, H, H * G, Lk, "FSBSBBFF", (granularity, 128, 1024), 128, torch.Generator().manual_seed(0))
        plan = type(plan)(plan.modes.cuda(), plan.streaming, plan.blocks, plan.block_size)
        ref = hybrid_attention(q, k, v, plan, backend="reference").float()
        for backend in ("triton", "split"):
            out = hybrid_attention(q, k, v, plan, backend=backend).float()
            assert (out - ref).norm() / ref.norm() < 1e-2, backend


def test_fp32_config_pipelines_shallower():
    from elastic_bench.kernels.hybrid.fused import CONFIGS, _fit_config

    assert CONFIGS[128].gather_stages > CONFIGS[128].num_stages  # the block-list loop's index load takes stages
    bf16 = _fit_config(None, 128, torch.bfloat16, None)
    fp32 = _fit_config(None, 128, torch.float32, None)
    assert bf16 == CONFIGS[128]
    assert (fp32.block_n, fp32.num_stages, fp32.gather_stages) == (CONFIGS[128].block_n // 2, 2, None)


def test_triton_unavailable_on_cpu_without_interpreter():
    from elastic_bench.kernels import available_backends, resolve_backend

    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("interpreter enabled in this process")
    assert "triton" not in available_backends("cpu") and "split" not in available_backends("cpu")
    assert resolve_backend("auto", "cpu") == "masked"
    with pytest.raises(RuntimeError, match="not available"):
        resolve_backend("triton", "cpu")


def test_auto_takes_a_backend_only_where_it_prefers_the_length(monkeypatch):
    from elastic_bench.kernels import hybrid
    from elastic_bench.kernels.hybrid.fused import SPLIT_MIN_KEYS, split_pays_off

    monkeypatch.setattr(hybrid, "_BACKENDS", dict(hybrid._BACKENDS))
    calls = []
    for name, priority, prefer in (("long_only", 90, split_pays_off), ("any_length", 80, None)):
        fn = lambda q, k, v, plan, scale, name=name: calls.append(name) or torch.zeros_like(q)
        hybrid.register_backend(name, fn, available=lambda device: device.type == "cpu", priority=priority,
                                prefer=prefer)
    assert hybrid.resolve_backend("auto", "cpu") == "long_only"  # no length given: the long-context choice
    assert hybrid.resolve_backend("auto", "cpu", SPLIT_MIN_KEYS) == "long_only"
    assert hybrid.resolve_backend("auto", "cpu", SPLIT_MIN_KEYS - 1) == "any_length"
    assert hybrid.resolve_backend("long_only", "cpu", 8) == "long_only"  # forcing a backend ignores preferences
    from elastic_bench.kernels import HeadPlan, Mode

    plan = HeadPlan.uniform(Mode.FULL, 1, 1)
    for keys in (64, SPLIT_MIN_KEYS):
        q = k = torch.zeros(1, 1, keys, 16)
        hybrid.hybrid_attention(q, k, k, plan)
    assert calls == ["any_length", "long_only"]


if __name__ == "__main__":
    print_case_results(CASES, _run_case)
