"""Training losses: BCE + soft Dice + soft clDice.

clDice (Shit et al., CVPR 2021) is a topology-aware term that rewards keeping thin pore throats
connected, which is what the Euler number counts. The loss weights come from a config object with
``bce``, ``dice``, ``cldice`` and ``cldice_iters`` attributes (the training config's ``loss``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["soft_skeleton", "loss_terms", "total_loss"]


def _soft_erode(x: torch.Tensor) -> torch.Tensor:  # x: (B, 1, Z, Y, X)
    p1 = -F.max_pool3d(-x, (3, 1, 1), 1, (1, 0, 0))
    p2 = -F.max_pool3d(-x, (1, 3, 1), 1, (0, 1, 0))
    p3 = -F.max_pool3d(-x, (1, 1, 3), 1, (0, 0, 1))
    return torch.min(torch.min(p1, p2), p3)


def _soft_dilate(x: torch.Tensor) -> torch.Tensor:
    return F.max_pool3d(x, 3, 1, 1)


def soft_skeleton(x: torch.Tensor, iters: int) -> torch.Tensor:
    """Soft morphological skeleton (Shit et al. 2021) of probabilities ``x`` (B, Z, Y, X)."""
    x = x.unsqueeze(1)
    skel = F.relu(x - _soft_dilate(_soft_erode(x)))
    for _ in range(iters):
        x = _soft_erode(x)
        delta = F.relu(x - _soft_dilate(_soft_erode(x)))
        skel = skel + F.relu(delta - skel * delta)
    return skel.squeeze(1)


def loss_terms(logits: torch.Tensor, target: torch.Tensor, loss: Any) -> dict:
    """Each loss term (unweighted) as a scalar tensor."""
    prob = torch.sigmoid(logits)
    terms = {"bce": F.binary_cross_entropy_with_logits(logits, target)}
    eps = 1.0
    inter = (prob * target).sum()
    terms["dice"] = 1 - (2 * inter + eps) / (prob.sum() + target.sum() + eps)
    if loss.cldice > 0:
        sp, st = soft_skeleton(prob, loss.cldice_iters), soft_skeleton(target, loss.cldice_iters)
        tprec = ((sp * target).sum() + eps) / (sp.sum() + eps)
        tsens = ((st * prob).sum() + eps) / (st.sum() + eps)
        terms["cldice"] = 1 - 2 * tprec * tsens / (tprec + tsens)
    return terms


def total_loss(terms: dict, loss: Any) -> torch.Tensor:
    """The weighted sum of the terms (weights: ``loss.bce``, ``loss.dice``, ``loss.cldice``)."""
    return sum(getattr(loss, k) * v for k, v in terms.items())
