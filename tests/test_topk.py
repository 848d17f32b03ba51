"""Top-k block selection (InfLLM-V2, MoBA, NSA's selection branch) against brute-force transcriptions of upstream's
per-token rules: rows of one query give upstream's own selection, longer rows the sum of their queries' scores; on
random and peaked keys, at the causal edges (a partial last block, keys fewer than a compressed key, chunks of
queries), with a GQA group's query heads sharing their KV head's selection, and a batch selecting as its samples do
alone."""

from __future__ import annotations

import math

import pytest
import torch

from elastic_bench.kernels import BlockSelection
from elastic_bench.kernels.topk import infllm_v2_select, moba_select, nsa_select
from elastic_bench.kernels.topk.scores import infllm_v2_scores, moba_scores, nsa_scores

# Upstream's geometry scaled down 4× (block / stride = 4 and kernel / stride = 2 as upstream's 64 / 16 and 32 / 16).
INFLLM = dict(block_size=16, kernel_size=8, kernel_stride=4, topk=6, init_blocks=1, local_blocks=2)
NSA = dict(block_size=16, kernel_size=8, kernel_stride=4, topk=5, init_blocks=1, local_blocks=2)
MOBA = dict(block_size=8, chunk_size=32, topk=3)


# ---- brute force: upstream's per-token scores, one query and one head at a time ---------------------------------


def pooled_keys(k: torch.Tensor, size: int, stride: int) -> list[torch.Tensor]:
    """Means of ``size`` keys every ``stride`` that lie wholly in ``k [L, D]`` (upstream's ``CompressK``)."""
    return [k[j * stride: j * stride + size].double().mean(0) for j in range((len(k) - size) // stride + 1)] \
        if len(k) >= size else []


def seen(j: int, p: int, size: int, stride: int) -> bool:
    """A compressed key counts for the query at ``p`` once its last token is at or before ``p``."""
    return j * stride + size - 1 <= p


def infllm_token_scores(q, k, p, block_size, kernel_size, kernel_stride, **_) -> list[float]:
    """InfLLM-V2's block scores of one query position of one KV head (before forcing): q [G, D], k [L, D] (keys up
    to the sequence end)."""
    scale = q.shape[-1] ** -0.5
    fine, coarse = pooled_keys(k, kernel_size, kernel_stride), pooled_keys(k, 4 * kernel_size, 4 * kernel_stride)
    score = [0.0] * len(fine)
    for qh in q.double():
        logits = [float(scale * qh @ c) for m, c in enumerate(coarse) if seen(m, p, 4 * kernel_size, 4 * kernel_stride)]
        if not logits:
            continue
        lse = math.log(sum(math.exp(x) for x in logits))
        for j, c in enumerate(fine):
            if seen(j, p, kernel_size, kernel_stride):
                score[j] += math.exp(float(scale * qh @ c) - lse)
    ratio, blocks = block_size // kernel_stride, -(-len(k) // block_size)
    out = []
    for b in range(blocks):  # max_pooling_1d: kernel ratio + 1, stride ratio, padding 1
        window = [score[j] for j in range(b * ratio - 1, b * ratio + ratio) if 0 <= j < len(fine)]
        out.append(max(window) if window else -math.inf)
    return out


def nsa_token_scores(q, k, p, block_size, kernel_size, kernel_stride, **_) -> list[float]:
    """NSA's block scores of one query position of one KV head (before forcing): transform_score of the summed
    softmax over the visible compressed keys."""
    scale = q.shape[-1] ** -0.5
    fine = pooled_keys(k, kernel_size, kernel_stride)
    score = [0.0] * len(fine)
    for qh in q.double():
        visible = [j for j in range(len(fine)) if seen(j, p, kernel_size, kernel_stride)]
        if not visible:
            continue
        total = sum(math.exp(float(scale * qh @ fine[j])) for j in visible)
        for j in visible:
            score[j] += math.exp(float(scale * qh @ fine[j])) / total
    ratio, span = block_size // kernel_stride, kernel_size // kernel_stride
    out = []
    for b in range(-(-len(k) // block_size)):
        if b >= len(k) // block_size:  # upstream scores whole blocks only
            out.append(0.0)
            continue
        # compressed key j covers stride segments j … j + span - 1; the block covers b·ratio … b·ratio + ratio - 1
        out.append(sum(score[j] * len({j + a for a in range(span)} & set(range(b * ratio, b * ratio + ratio)))
                       for j in range(len(fine))))
    return out


def moba_token_scores(q, k, p, chunk_size, **_) -> list[float]:
    """MoBA's gate of one query position of one query head: q [1, D] against each chunk's mean key."""
    return [float(q[0].double() @ k[c: c + chunk_size].double().mean(0)) for c in range(0, len(k), chunk_size)]


def forced_and_reach(method: str, row: int, n: int, cfg: dict) -> tuple[set[int], int]:
    """(forced key blocks, last candidate block) of the row ``row`` (a chunk index for MoBA)."""
    if method == "moba":
        own = row * cfg["block_size"] // cfg["chunk_size"]
        return {own}, own
    local = cfg["local_blocks"]
    near = range(row - local, row + 1) if method == "infllm_v2" else range(row - local + 1, row + 1)
    return {c for c in [*range(cfg["init_blocks"]), *near] if 0 <= c <= row}, row


def pick(scores: list[float], forced: set[int], reach: int, k: int) -> list[int]:
    """Forced blocks, then the best others up to ``reach`` (ties: lower index), ``k`` in all."""
    assert len(forced) <= k
    others = sorted((c for c in range(reach + 1) if c not in forced), key=lambda c: (-scores[c], c))
    return sorted([*forced, *others][:k])


TOKEN = {"infllm_v2": infllm_token_scores, "nsa": nsa_token_scores, "moba": moba_token_scores}
SELECT = {"infllm_v2": infllm_v2_select, "nsa": nsa_select, "moba": moba_select}
SCORES = {"infllm_v2": infllm_v2_scores, "nsa": nsa_scores, "moba": moba_scores}
CONFIG = {"infllm_v2": INFLLM, "nsa": NSA, "moba": MOBA}


def brute_force(method: str, q: torch.Tensor, k: torch.Tensor, cfg: dict) -> torch.Tensor:
    """Bool ``[B, Hq, nB, nB]`` of the plan blocks each row keeps: per row, upstream's per-token scores summed over the
    row's queries, then forced blocks and the best others (MoBA: per query head, chunks expanded to blocks)."""
    B, Hq, Lq, _ = q.shape
    H, Lk = k.shape[1], k.shape[2]
    G, bs = Hq // H, cfg["block_size"]
    nB = -(-Lk // bs)
    out = torch.zeros(B, Hq, nB, nB, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            selectors = [[g] for g in range(G)] if method == "moba" else [list(range(G))]
            for members in selectors:
                for row in range((Lk - Lq) // bs, nB):
                    positions = [p for p in range(max(Lk - Lq, row * bs), min(Lk, (row + 1) * bs))]
                    per_token = [TOKEN[method](q[b, [h * G + g for g in members], p - (Lk - Lq)], k[b, h], p, **cfg)
                                 for p in positions]
                    summed = [sum(t[c] for t in per_token) for c in range(len(per_token[0]))]
                    if method == "moba":
                        forced, reach = forced_and_reach(method, row, nB, cfg)
                        chunks = pick(summed, forced, reach, cfg["topk"])
                        ratio = cfg["chunk_size"] // bs
                        kept = [c * ratio + i for c in chunks for i in range(ratio) if c * ratio + i <= row]
                    else:
                        forced, reach = forced_and_reach(method, row, nB, cfg)
                        kept = pick(summed, forced, reach, cfg["topk"])
                    for g in members:
                        out[b, h * G + g, row, kept] = True
    return out


def upstream_token_selection(method: str, q: torch.Tensor, k: torch.Tensor, cfg: dict) -> set[int]:
    """Upstream's own rule for one query (the call's last position) of one KV group, literally: top-k over every
    block with forced ones at +inf (future blocks included, their scores as computed), then the future ones dropped
    (``topk_idx[topk_idx > q_idx] = -1``)."""
    p = k.shape[0] - 1
    scores = TOKEN[method](q, k, p, **cfg)
    row = p // cfg["block_size"]
    forced, own = forced_and_reach(method, row, len(scores), cfg)
    if method == "moba":  # upstream's gate is -inf for the chunks after the query's own
        scores = [s if c <= own else -math.inf for c, s in enumerate(scores)]
    ranked = sorted(range(len(scores)), key=lambda c: (-(math.inf if c in forced else scores[c]), c))
    return {c for c in ranked[: min(cfg["topk"], len(scores))] if c <= (own if method == "moba" else row)}


def dense(selection: BlockSelection, Lk: int, block_size: int) -> torch.Tensor:
    return selection.to_dense(-(-Lk // block_size)).cpu()


def inputs(B=1, Hq=4, H=2, Lq=150, Lk=150, D=8, seed=0, peak: int | None = None, rival: float | None = None):
    """Random q, k; with ``peak``, the keys of the tokens [peak, peak + 8) made to match every query; with ``rival``,
    the odd query heads match another direction instead, that of the keys [peak + 48, peak + 56) at strength
    ``rival``: a group's heads then disagree, and the selection weighs them."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Lq, D, generator=gen)
    k = torch.randn(B, H, Lk, D, generator=gen)
    if peak is not None:
        direction, other = torch.randn(2, D, generator=gen)
        q[:, ::2] += 3 * direction
        q[:, 1::2] += 3 * (other if rival is not None else direction)
        k[:, :, peak: peak + 8] = 4 * direction
        if rival is not None:
            k[:, :, peak + 48: peak + 56] = rival * other
    return q, k


# ---- against the brute force ------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", list(SELECT))
@pytest.mark.parametrize("case", ["random", "peaked", "rivals", "partial", "short", "chunk"])
def test_the_selection_is_upstreams_rule_summed_over_each_row(method, case):
    cfg = CONFIG[method]
    shape = {"random": dict(Lq=150, Lk=150), "peaked": dict(Lq=160, Lk=160, peak=40),
             "rivals": dict(Lq=200, Lk=200, peak=20, rival=1.5),
             "partial": dict(Lq=133, Lk=133, seed=1),  # a partial last block
             "short": dict(Lq=7, Lk=7, seed=2),  # fewer keys than a compressed key
             "chunk": dict(Lq=45, Lk=141, seed=3)}[case]  # a chunk of queries starting inside a row
    q, k = inputs(B=2, **shape)
    got = dense(SELECT[method](q, k, **cfg), k.shape[2], cfg["block_size"])
    assert torch.equal(got, brute_force(method, q, k, cfg))
    if case == "peaked":  # every late row takes the block of the planted keys
        planted = 40 // cfg["block_size"]
        assert got[:, :, planted + 4:, planted].all()


@pytest.mark.parametrize("method", list(SELECT))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_row_of_one_query_is_upstreams_per_token_selection(method, seed):
    cfg = CONFIG[method]
    q, k = inputs(B=1, Lq=1, Lk=150 + 13 * seed, seed=seed, peak=None if seed != 2 else 60)
    got = dense(SELECT[method](q, k, **cfg), k.shape[2], cfg["block_size"])[0, :, -1]
    G = q.shape[1] // k.shape[1]
    for hq in range(q.shape[1]):
        members = [hq] if method == "moba" else list(range(hq // G * G, hq // G * G + G))
        chosen = upstream_token_selection(method, q[0, members, 0], k[0, hq // G], cfg)
        if method == "moba":
            ratio = cfg["chunk_size"] // cfg["block_size"]
            row = (k.shape[2] - 1) // cfg["block_size"]
            chosen = {c * ratio + i for c in chosen for i in range(ratio) if c * ratio + i <= row}
        assert set(got[hq].nonzero()[:, 0].tolist()) == chosen


def test_upstream_geometry_on_a_longer_prompt():
    """InfLLM-V2's and NSA's own block 64 / compression 32 every 16, and MoBA's chunks at 8 plan blocks."""
    q, k = inputs(B=1, Hq=2, H=1, Lq=70, Lk=900, D=4, seed=5)
    for method, cfg in [("infllm_v2", dict(INFLLM, block_size=64, kernel_size=32, kernel_stride=16, local_blocks=3)),
                        ("nsa", dict(NSA, block_size=64, kernel_size=32, kernel_stride=16)),
                        ("moba", dict(block_size=64, chunk_size=512, topk=2))]:
        got = dense(SELECT[method](q, k, **cfg), k.shape[2], cfg["block_size"])
        assert torch.equal(got, brute_force(method, q, k, cfg)), method


# ---- properties of the contract -------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["infllm_v2", "nsa"])
def test_a_gqa_group_shares_its_selection_and_every_query_head_counts(method):
    cfg = CONFIG[method]
    q, k = inputs(B=1, Hq=6, H=2, Lq=150, Lk=150, seed=4)
    got = dense(SELECT[method](q, k, **cfg), 150, cfg["block_size"])
    assert torch.equal(got[0, 0], got[0, 1]) and torch.equal(got[0, 1], got[0, 2])
    assert torch.equal(got[0, 3], got[0, 5])
    swapped = dense(SELECT[method](q[:, [2, 0, 1, 5, 3, 4]], k, **cfg), 150, cfg["block_size"])
    assert torch.equal(swapped, got)  # the order of a group's heads does not matter
    alone = dense(SELECT[method](q[:, [0, 0, 0, 3, 3, 3]], k, **cfg), 150, cfg["block_size"])
    assert not torch.equal(alone, got)  # the group's other heads count


def test_moba_selects_per_query_head():
    q, k = inputs(B=1, Hq=4, H=2, Lq=150, Lk=150, seed=6)
    got = dense(moba_select(q, k, **MOBA), 150, MOBA["block_size"])
    assert not torch.equal(got[0, 0], got[0, 1])


@pytest.mark.parametrize("method", list(SELECT))
def test_a_batch_selects_as_its_samples_do_alone_and_heads_limit_the_rows(method):
    cfg = CONFIG[method]
    q, k = inputs(B=4, Lq=140, Lk=140, seed=7)
    batch = dense(SELECT[method](q, k, **cfg), 140, cfg["block_size"])
    for b in range(4):
        assert torch.equal(batch[b], dense(SELECT[method](q[b: b + 1], k[b: b + 1], **cfg), 140, cfg["block_size"])[0])
    heads = torch.tensor([[True, False], [False, False], [False, True], [True, True]])
    some = dense(SELECT[method](q, k, heads=heads, **cfg), 140, cfg["block_size"])
    marked = heads.repeat_interleave(2, dim=1)
    assert torch.equal(some[marked], batch[marked]) and not some[~marked].any()


@pytest.mark.parametrize("method", list(SELECT))
def test_every_row_keeps_its_diagonal_and_k_blocks(method):
    cfg = CONFIG[method]
    q, k = inputs(B=1, Lq=200, Lk=200, seed=8)
    selection = SELECT[method](q, k, **cfg)
    got = dense(selection, 200, cfg["block_size"])
    rows = torch.arange(got.shape[2])
    assert got[0, :, rows, rows].all() and not torch.triu(got[0], diagonal=1).any()
    if method != "moba":
        assert (selection.counts[0] == torch.clamp(rows + 1, max=cfg["topk"])).all()


@pytest.mark.parametrize("method", list(SELECT))
def test_the_row_scores_are_the_sums_of_upstreams_per_token_scores(method):
    """The values, not only the ranking: every candidate block's row score is the brute force's sum (what a group's
    heads weigh, e.g. InfLLM-V2's normalisation by the coarse keys a query sees, shows here)."""
    cfg = CONFIG[method]
    q, k = inputs(B=1, Lq=60, Lk=150, peak=20, rival=2.0, seed=9)
    options = {key: v for key, v in cfg.items() if key != "topk"}
    scores, first = SCORES[method](q, k, **options)
    G, bs, off = q.shape[1] // k.shape[1], cfg["block_size"], k.shape[2] - q.shape[2]
    for s in range(scores.shape[1]):
        members = [s] if method == "moba" else list(range(s * G, s * G + G))
        for n, row in enumerate(range(first, first + scores.shape[2])):
            positions = range(max(off, row * bs), min(k.shape[2], (row + 1) * bs))
            tokens = [TOKEN[method](q[0, members, p - off], k[0, members[0] // G], p, **cfg) for p in positions]
            expected = torch.tensor([sum(t[c] for t in tokens) for c in range(len(tokens[0]))], dtype=torch.float32)
            candidate = torch.isfinite(scores[0, s, n])
            assert torch.allclose(scores[0, s, n][candidate], expected[candidate], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", list(SELECT))
def test_rows_scored_a_few_at_a_time_select_as_all_at_once(method, monkeypatch):
    from elastic_bench.kernels.topk import scores

    cfg = CONFIG[method]
    q, k = inputs(B=2, Lq=130, Lk=190, seed=10)  # a chunk of queries starting inside a row
    whole = SELECT[method](q, k, **cfg)
    monkeypatch.setattr(scores, "ELEMENTS", {"cpu": 1})  # one row per chunk
    rows = SELECT[method](q, k, **cfg)
    assert torch.equal(rows.counts, whole.counts) and torch.equal(rows.indices, whole.indices)
