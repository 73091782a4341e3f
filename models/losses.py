"""Training losses: BCE + soft Dice + soft clDice + skeleton recall.

clDice (Shit et al., CVPR 2021) is a topology-aware term that rewards keeping thin pore throats
connected, which is what the Euler number counts. Skeleton recall (Kirchhoff et al., ECCV 2024)
asks the prediction to cover the skeleton of each phase of the truth: of the pores (so that thin
channels stay open) and of the solid (so that thin walls between pores stay closed); the skeletons
are computed from the labels in the data loader, not differentiated through. The loss weights come
from a config object with ``bce``, ``dice``, ``cldice``, ``cldice_iters`` and ``skeleton_recall``
attributes (the training config's ``loss``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["soft_skeleton", "skeleton_recall", "loss_terms", "total_loss"]


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


def skeleton_recall(prob: torch.Tensor, skeletons: torch.Tensor, eps: float = 1.0) -> torch.Tensor:
    """1 - the mean of the recalls of the pore and the solid skeleton.

    Parameters
    ----------
    prob : torch.Tensor
        Pore probabilities (B, Z, Y, X).
    skeletons : torch.Tensor
        (B, 2, Z, Y, X) 0/1: channel 0 the truth's pore skeleton, channel 1 its solid skeleton.

    Examples
    --------
    >>> sk = torch.zeros(1, 2, 1, 1, 4); sk[0, 0, 0, 0, :2] = 1; sk[0, 1, 0, 0, 2:] = 1
    >>> p = torch.tensor([[[[1.0, 1.0, 0.0, 0.0]]]])       # both skeletons kept
    >>> float(skeleton_recall(p, sk, eps=0.0))
    0.0
    >>> float(skeleton_recall(1 - p, sk, eps=0.0))           # both lost
    1.0
    """
    pore, solid = skeletons[:, 0], skeletons[:, 1]
    rec_pore = ((prob * pore).sum() + eps) / (pore.sum() + eps)
    rec_solid = (((1 - prob) * solid).sum() + eps) / (solid.sum() + eps)
    return 1 - 0.5 * (rec_pore + rec_solid)


def loss_terms(logits: torch.Tensor, target: torch.Tensor, loss: Any,
               skeletons: torch.Tensor | None = None) -> dict:
    """Each loss term (unweighted) as a scalar tensor (``skeletons``: see :func:`skeleton_recall`,
    needed when ``loss.skeleton_recall`` > 0)."""
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
    if getattr(loss, "skeleton_recall", 0) > 0:
        if skeletons is None:
            raise ValueError("loss.skeleton_recall > 0 needs the labels' skeletons")
        terms["skeleton_recall"] = skeleton_recall(prob, skeletons)
    return terms


def total_loss(terms: dict, loss: Any) -> torch.Tensor:
    """The weighted sum of the terms (weights: ``loss.bce``, ``loss.dice``, ``loss.cldice``,
    ``loss.skeleton_recall``)."""
    return sum(getattr(loss, k) * v for k, v in terms.items())
