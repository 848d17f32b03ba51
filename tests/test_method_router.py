"""Attention Router, Gumbel relaxation, temperature schedules and the Lagrangian objective."""

from __future__ import annotations

import math

import pytest
import torch

from elastic_bench.method.objective import LagrangeMultipliers, constraint_gap, omega_msr, sparsity_penalty
from elastic_bench.method.relaxation import (
    gumbel_noise,
    gumbel_sigmoid_ste,
    gumbel_softmax_ste,
    relax,
    temperature,
)
from elastic_bench.method.router import AttentionRouter


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_parameter_count_matches_the_paper():
    assert n_params(AttentionRouter(128)) == 263_682
    assert n_params(AttentionRouter(128, num_logits=1)) == 263_553  # Gumbel-sigmoid variant (App. F)
    for d, m in [(64, 2), (16, 4), (128, 8)]:
        assert n_params(AttentionRouter(d, hidden_mult=m)) == 2 * (2 * m * d * d + m * d + d) + 2 * d + 2


def test_state_dict_names_match_the_released_checkpoints():
    names = set(AttentionRouter(16).state_dict())
    expected = {f"cls_feat_extractor.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")}
    expected |= {f"cls_router_head_agnostic.{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias")}
    assert names == expected


def test_neutral_initialisation():
    router = AttentionRouter(128)
    weights = torch.cat([m.weight.detach().flatten() for m in router.modules() if isinstance(m, torch.nn.Linear)])
    assert abs(float(weights.std()) - 0.02) < 1e-3
    assert all(float(m.bias.detach().abs().max()) == 0 for m in router.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("length", [50, 150, 200, 500])
def test_boundary_pooling_is_the_mean_of_the_concatenated_slices(length):
    keys = torch.randn(2, 3, length, 8)
    router = AttentionRouter(8)
    expected = torch.cat([keys[:, :, :100], keys[:, :, -100:]], dim=2).mean(dim=2)
    torch.testing.assert_close(router.pool(keys), expected)
    if 100 < length < 200:  # overlapping tokens count twice, as the official inference code
        assert not torch.allclose(router.pool(keys), keys.mean(dim=2))
    torch.testing.assert_close(AttentionRouter(8, pooling="mean").pool(keys), keys.mean(dim=2))


def test_router_shares_weights_across_heads_and_index_one_is_full():
    router = AttentionRouter(8)
    keys = torch.randn(1, 2, 30, 8)
    logits = router(keys.flip(1))
    torch.testing.assert_close(logits, router(keys).flip(1))  # no head embedding: heads are exchangeable
    assert AttentionRouter.decide(torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])).tolist() == [[True, False]]
    assert AttentionRouter.decide(torch.tensor([[[0.5], [-0.5]]])).tolist() == [[True, False]]


def test_feature_centering_subtracts_a_fixed_per_head_mean_before_the_shared_mlps():
    plain, centered = AttentionRouter(8), AttentionRouter(8, num_kv_heads=2)
    assert plain.feature_mean is None and centered.feature_mean.shape == (2, 8)
    assert n_params(centered) == n_params(plain)  # a buffer, not a trained parameter
    centered.load_state_dict({**plain.state_dict(), "feature_mean": torch.randn(2, 8)})
    keys = torch.randn(3, 2, 250, 8)
    shifted = keys - centered.feature_mean[None, :, None, :]  # pooling is a mean, so centering commutes with it
    torch.testing.assert_close(centered(keys), plain(shifted))


def test_straight_through_softmax_is_hard_forward_and_soft_backward():
    logits = torch.randn(5, 3, 2, requires_grad=True)
    noise = gumbel_noise((5, 3, 2), torch.Generator().manual_seed(0))
    r = gumbel_softmax_ste(logits, noise, tau=0.7)
    assert set(r.unique().tolist()) <= {0.0, 1.0}
    torch.testing.assert_close(r, ((logits + noise).argmax(-1) == 1).float())
    weights = torch.randn(5, 3)
    (r * weights).sum().backward()
    soft = torch.softmax((logits.detach() + noise) / 0.7, -1)[..., 1]
    expected = (weights * soft * (1 - soft) / 0.7)[..., None] * torch.tensor([-1.0, 1.0])
    torch.testing.assert_close(logits.grad, expected)


def test_gumbel_sigmoid_is_the_binary_relaxation_of_the_same_noise():
    logit = torch.randn(4, 3, 1, requires_grad=True)
    noise = gumbel_noise((4, 3, 2), torch.Generator().manual_seed(1))
    r = gumbel_sigmoid_ste(logit, noise, tau=1.0)
    two = torch.cat([torch.zeros_like(logit), logit], dim=-1)  # softmax over (0, z) = sigmoid(z)
    torch.testing.assert_close(r, gumbel_softmax_ste(two, noise, 1.0))
    r.sum().backward()
    assert float(logit.grad.abs().min()) > 0
    assert relax(logit, noise, 1.0).shape == (4, 3)


def test_gumbel_noise_is_standard_gumbel():
    g = gumbel_noise((200_000,), torch.Generator().manual_seed(0))
    assert abs(float(g.mean()) - 0.5772) < 0.01  # Euler–Mascheroni constant
    assert abs(float(g.var()) - math.pi**2 / 6) < 0.03


def test_temperature_schedules():
    # official cosine: 1.5 → 1.0 over ceil(0.6 · 300) = 180 steps, then constant
    assert temperature(0, 300, "cosine") == pytest.approx(1.5)
    assert temperature(90, 300, "cosine") == pytest.approx(1.25)
    assert temperature(180, 300, "cosine") == temperature(299, 300, "cosine") == 1.0
    # paper Eq. 14 with p = step / steps: reaches τ_min at p = ln(1.5) / 0.6 ≈ 0.676
    assert temperature(0, 1000, "exponential") == pytest.approx(1.5)
    assert temperature(670, 1000) > 1.0 and temperature(680, 1000) == 1.0
    taus = [temperature(s, 100) for s in range(100)]
    assert all(a >= b for a, b in zip(taus, taus[1:]))
    with pytest.raises(ValueError, match="exponential"):
        temperature(0, 10, "linear")


def test_omega_is_the_sparse_fraction_over_layers_and_heads():
    r = torch.tensor([[[1.0, 0.0], [1.0, 1.0]], [[0.0, 0.0], [0.0, 0.0]]])
    assert omega_msr(r).tolist() == [0.25, 1.0]


def test_penalty_is_the_mean_over_categories_of_the_within_category_mean():
    lam = LagrangeMultipliers(2)
    with torch.no_grad():
        lam.lambda1.copy_(torch.tensor([1.0, 2.0]))
        lam.lambda2.copy_(torch.tensor([10.0, 0.0]))
    omega = torch.tensor([0.9, 0.5, 0.8])
    category = torch.tensor([0, 0, 1])
    targets = torch.tensor([0.7, 1.0])
    d = omega - targets[category]  # [0.2, -0.2, -0.2]
    cat0 = ((1.0 * d[0] + 10 * d[0] ** 2) + (1.0 * d[1] + 10 * d[1] ** 2)) / 2
    cat1 = 2.0 * d[2]
    torch.testing.assert_close(sparsity_penalty(omega, category, targets, lam), (cat0 + cat1) / 2)
    official = sparsity_penalty(omega, category, targets, lam, penalty="abs")
    assert float(official.detach()) == pytest.approx(((0.2 + 0.4) + (0.2 + 0.4)) / 2 / 2 + 2.0 * 0.2 / 2)


def test_interval_gap_is_zero_inside_the_tolerance():
    omega = torch.tensor([0.65, 0.72, 0.9, 0.5])
    gap = constraint_gap(omega, torch.full((4,), 0.7), interval=(-0.1, 0.05))
    torch.testing.assert_close(gap, torch.tensor([0.0, 0.0, 0.15, -0.1]))


def test_lambda_ascent_enforces_the_constraint():
    """Ω above its target raises λ1 (pushing Ω down); Ω below lowers it (pushing Ω up); λ2 grows either way."""
    lam = LagrangeMultipliers(2, torch.Generator().manual_seed(0))
    before = [p.detach().clone() for p in lam.parameters()]
    opt = torch.optim.AdamW(lam.parameters(), lr=0.1, maximize=True, weight_decay=0.0)
    omega = torch.tensor([0.9, 0.4])  # category 0 above its target 0.7, category 1 below its target 1.0
    sparsity_penalty(omega, torch.tensor([0, 1]), torch.tensor([0.7, 1.0]), lam).backward()
    opt.step()
    assert lam.lambda1[0] > before[0][0] and lam.lambda1[1] < before[0][1]
    assert bool((lam.lambda2 > before[1]).all())
    assert lam.table(["a", "b"])["lambda1"]["a"] == pytest.approx(float(lam.lambda1[0].detach()))
