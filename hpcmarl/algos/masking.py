"""Legal-action masks in the math: an illegal action never wins an argmax, a max or a draw.

A row with no legal action at all (a terminal s' whose env sends an empty mask) has no value to
bootstrap from; its masked max is 0, never -inf, so `(1 - done) * value` stays finite.
"""

from __future__ import annotations

import torch


def masked(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """`scores` [B, n] with the illegal entries at -inf (as is without a mask)."""
    return scores if mask is None else scores.masked_fill(~mask, -torch.inf)


def masked_argmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The best legal action of each row, int64 [B, 1] (action 0 for a row with none)."""
    return masked(scores, mask).argmax(dim=1, keepdim=True)


def masked_max(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The best legal score of each row, [B]; 0 for a row with no legal action."""
    best = masked(scores, mask).max(dim=1).values
    return best if mask is None else torch.where(mask.any(dim=1), best, 0.0)


def masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """log pi over the legal actions ([B, n], -inf on illegal ones)."""
    return torch.log_softmax(masked(logits, mask), dim=-1)


def entropy_of(log_probs: torch.Tensor) -> torch.Tensor:
    """-sum p log p per row, with 0 log 0 = 0 for the illegal actions: the -inf is replaced
    before the product, so neither the value nor its gradient is NaN."""
    finite = torch.where(torch.isfinite(log_probs), log_probs, 0.0)
    return -(log_probs.exp() * finite).sum(-1)
