"""What the router's two sides mean in FA-SSA, FA-XA and XA-SSA, and the HeadPlan of a routing decision.

Paper §3.1 and App. D; official eval model ``LCM-Lab/Elastic-Attention`` @ c62a0fe,
``elasticattn/training/eval/modeling_flash_qwen.py:1118-1143``.

| mode     | full side (router index 1) | sparse side (router index 0) |
|----------|----------------------------|------------------------------|
| fa-ssa   | FULL (dense causal)        | STREAMING                    |
| fa-xa    | FULL                       | BLOCK_SPARSE (XAttention)    |
| xa-ssa   | BLOCK_SPARSE (XAttention)  | STREAMING                    |

The BLOCK_SPARSE side selects its blocks with XAttention (``selector="xattention"``, the paper's) or, with
``selector=`` the name of a top-k block method (``infllm_v2``, ``moba``, ``nsa``: `elastic_bench.baselines.topk`), with
that method at its defaults: FA-InfLLM is ``mode="fa-xa", selector="infllm_v2"``. Valid combinations: ``fa-xa`` with
every selector (its plan takes the selector's blocks: 64 tokens for InfLLM-V2 and NSA); ``xa-ssa`` with a selector
whose blocks are the streaming side's (``block_size``: XAttention, MoBA); ``fa-ssa`` has no BLOCK_SPARSE side, so
``xattention`` only.

Design decisions:
- Streaming is block-granular by default (Block-Sparse-Attention semantics): sink 128 tokens (1 block) and a local
  window of 2048 tokens (16 blocks, the diagonal block included).
- XAttention selections (stride 16, block 128, per query head, upstream's selection rule) are estimated only for the
  heads routed to XA, and not at all when no head is (the official eval model estimates every head on every
  prefill). The estimator lives in `elastic_bench.kernels.xattention` and is imported only when an XA head exists.
- XAttention threshold: τ 0.9 by default, the paper's (`PAPER_XA_THRESHOLD`). The official evaluation code of the
  released FA-XA / XA-SSA routers hard-codes τ 0.8 (`OFFICIAL_XA_THRESHOLD`; ``xattn_params`` of the eval model,
  passed to ``Xattention_prefill_dim4`` with its automatic chunk size): ``-O elastic.xa_threshold=official``
  reproduces it.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Literal

import torch

from elastic_bench.kernels import BlockSelection, HeadPlan, Mode, StreamingGeometry
from elastic_bench.kernels.xattention import RULES, Rule

ModeName = Literal["fa-ssa", "fa-xa", "xa-ssa"]
Selector = Literal["xattention", "infllm_v2", "moba", "nsa"]
SELECTORS = ("xattention", "infllm_v2", "moba", "nsa")
SIDES: dict[str, tuple[Mode, Mode]] = {
    "fa-ssa": (Mode.FULL, Mode.STREAMING),
    "fa-xa": (Mode.FULL, Mode.BLOCK_SPARSE),
    "xa-ssa": (Mode.BLOCK_SPARSE, Mode.STREAMING),
}
PAPER_XA_THRESHOLD = 0.9  # the paper's XAttention τ, the default
OFFICIAL_XA_THRESHOLD = 0.8  # the τ of the official evaluation code (modeling_flash_qwen.py, xattn_params)


@dataclass(frozen=True)
class ModeConfig:
    """The attention each router side stands for.

    Attributes:
        mode: ``"fa-ssa"``, ``"fa-xa"`` or ``"xa-ssa"``.
        sink, local: streaming sink and local-window tokens.
        granularity: streaming granularity, ``"block"`` (default) or ``"token"``.
        block_size: block size of streaming blocks and XAttention selections.
        xa_stride, xa_threshold: XAttention antidiagonal stride and cumulative-mass threshold τ (0.9, the paper's;
            the official evaluation code uses `OFFICIAL_XA_THRESHOLD` = 0.8).
        xa_rule: XAttention block-selection rule, ``upstream`` (upstream's, as the official evaluation code runs
            it) or ``strict`` (see `elastic_bench.kernels.xattention`).
        selector: what selects the BLOCK_SPARSE side's blocks: ``xattention`` (the ``xa_*`` fields) or a top-k block
            method at its defaults (``infllm_v2``, ``moba``, ``nsa``); fa-xa takes each, xa-ssa xattention or moba.
    """

    mode: ModeName = "fa-ssa"
    sink: int = 128
    local: int = 2048
    granularity: Literal["token", "block"] = "block"
    block_size: int = 128
    xa_stride: int = 16
    xa_threshold: float = PAPER_XA_THRESHOLD
    xa_rule: Rule = "upstream"
    selector: Selector = "xattention"

    def __post_init__(self):
        if self.mode not in SIDES:
            raise ValueError(f"elastic mode must be one of {', '.join(SIDES)}; got {self.mode!r}")
        StreamingGeometry(self.sink, self.local, self.granularity)  # validates
        if not 0.0 <= self.xa_threshold <= 1.0:
            raise ValueError(f"xa_threshold must lie in [0, 1], got {self.xa_threshold}")
        if self.xa_rule not in RULES:
            raise ValueError(f"xa_rule must be one of {', '.join(RULES)}; got {self.xa_rule!r}")
        if self.block_size < 1 or self.xa_stride < 1 or self.block_size % self.xa_stride:
            raise ValueError(f"xa_stride ({self.xa_stride}) must be >= 1 and divide block_size ({self.block_size})")
        if self.selector not in SELECTORS:
            raise ValueError(f"selector must be one of {', '.join(SELECTORS)}; got {self.selector!r}")
        if self.selector != "xattention" and Mode.BLOCK_SPARSE not in self.sides:
            raise ValueError(f"{self.mode} has no block-sparse side to select for (selector={self.selector}): use "
                             "fa-xa or xa-ssa")
        if self.mode == "xa-ssa" and self.plan_block_size != self.block_size:
            raise ValueError(f"selector={self.selector} selects {self.plan_block_size}-token blocks, the streaming "
                             f"side's are {self.block_size}: xa-ssa takes xattention or moba (fa-xa takes every "
                             "selector)")

    @functools.cached_property
    def top_k(self):
        """The top-k block method that selects the BLOCK_SPARSE side's blocks (None for XAttention)."""
        if self.selector == "xattention":
            return None
        from elastic_bench.modeling.interface import get_method

        return get_method(self.selector)

    @property
    def plan_block_size(self) -> int:
        """The block size of this mode's plans with a BLOCK_SPARSE head: the selector's."""
        return self.block_size if self.top_k is None else self.top_k.block_size

    @property
    def geometry(self) -> StreamingGeometry:
        return StreamingGeometry(self.sink, self.local, self.granularity)

    @property
    def sides(self) -> tuple[Mode, Mode]:
        """(full-side mode, sparse-side mode)."""
        return SIDES[self.mode]

    def to_dict(self) -> dict:
        """The fields, ``selector`` only when it is not XAttention: a checkpoint of an XAttention-side router reads as
        before the selector existed, so it keeps its digest."""
        fields = asdict(self)
        if self.selector == "xattention":
            del fields["selector"]
        return fields

    def plan(self, full_side: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> HeadPlan:
        """The HeadPlan of a routing decision.

        Args:
            full_side: ``[B, H]`` bool, True where the router chose index 1.
            query: ``[B, Hq, Lq, D]`` post-RoPE queries (XAttention scores them).
            key: ``[B, H, Lk, D]`` post-RoPE keys.
        """
        full_mode, sparse_mode = self.sides
        modes = torch.where(full_side.to(key.device), int(full_mode), int(sparse_mode)).to(torch.uint8)
        is_xa = modes == Mode.BLOCK_SPARSE
        blocks = self._select(query, key, is_xa) if bool(is_xa.any()) else None
        return HeadPlan(modes, self.geometry, blocks, self.plan_block_size)

    def side_plan(self, full: bool, query: torch.Tensor, key: torch.Tensor) -> HeadPlan:
        """Every head on one side (the two branches of the training forward); the modes on the host where the side
        selects no blocks (no device sync)."""
        B, H = key.shape[:2]
        mode = self.sides[0 if full else 1]
        if mode != Mode.BLOCK_SPARSE:
            return HeadPlan.uniform(mode, B, H, streaming=self.geometry, block_size=self.block_size)
        return self.plan(torch.full((B, H), full, dtype=torch.bool, device=key.device), query, key)

    def _select(self, query: torch.Tensor, key: torch.Tensor, heads: torch.Tensor) -> BlockSelection:
        from elastic_bench.kernels.xattention import xattention_select

        with torch.no_grad():
            if self.top_k is not None:
                return self.top_k.select(query.detach(), key.detach(), heads)
            return xattention_select(
                query.detach(), key.detach(), threshold=self.xa_threshold, stride=self.xa_stride,
                block_size=self.block_size, heads=heads, rule=self.xa_rule,
            )
