"""Ranking metrics as trec_eval computes them (through pytrec_eval, which HELMET and LongBench Pro call)."""

from __future__ import annotations

import math


def ndcg(scores: dict[str, float], relevance: dict[str, float], k: int) -> float:
    """trec_eval's ``ndcg_cut_k`` of one query: documents ranked by score (ties by document id, descending), gains
    their relevance (documents without a positive one gain 0), discounts ``log2(rank + 1)``, normalised by the ideal
    ranking of the judged documents; 0 when no document is relevant."""
    ranked = sorted(scores, key=lambda doc: (scores[doc], doc), reverse=True)[:k]
    dcg = sum(max(relevance.get(doc, 0), 0) / math.log2(i + 2) for i, doc in enumerate(ranked))
    ideal = sorted((g for g in relevance.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0
