"""The z-neighbour refit: a voxel's probability refitted from its own logit and its two z-neighbours'.

A labeller's idea of where a pore ends differs from the model's, and not only by a threshold: one
labeller calls pore a voxel that a pore one slice above or below reaches (a 3D dilation), another
does not. A network that looks only backwards along Z (PoreFormer is causal) cannot learn the slice
below from a few labelled slices. This map can: with ``l`` the logit of the raw probability,

    p' = sigmoid(a * l(z) + b * max(l(z - 1), l(z + 1)) + c * min(l(z - 1), l(z + 1)) + d)

(the max and min make it symmetric in up and down). ``(a, b, c, d)`` are fitted on the labelled
voxels by logistic regression (:func:`fit_zmix`, Newton's method, deterministic); ``(1, 0, 0, 0)`` is
the identity. At the first and last slice the missing neighbour is the slice itself. A voxel whose
raw probability is exactly 0 (outside the sample, the surface's rim) stays 0.

Streamed slab by slab it needs one slice of halo on each side (:func:`mix_slab`), read on its own
(a slice lies within one slab of a split run), so a slab's result equals the whole volume's.

Examples
--------
>>> p = np.full((3, 2, 2), 0.2, np.float32); p[1] = 0.9
>>> w = {"w": [1.0, 0.0, 0.0, 0.0]}
>>> bool(np.allclose(mix_volume(p, w), p, atol=1e-6))
True
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

__all__ = ["EPS", "fit_zmix", "mix_slab", "mix_volume", "zmix_features"]

#: Probabilities are clipped to ``[EPS, 1 - EPS]`` before the logit.
EPS = 1e-4


def _logit(p: np.ndarray) -> np.ndarray:
    q = np.clip(np.asarray(p, np.float32), EPS, 1.0 - EPS)
    return np.log(q / (1.0 - q))


def zmix_features(prev: np.ndarray, core: np.ndarray, nxt: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(l, max, min)`` of the slices ``core`` (n, Y, X), with ``prev`` the slice before them and
    ``nxt`` the slice after (each (1, Y, X)): the logit, the larger and the smaller neighbour logit."""
    lg = _logit(np.concatenate([prev, core, nxt]))
    up, dn = lg[:-2], lg[2:]
    return lg[1:-1], np.maximum(up, dn), np.minimum(up, dn)


def _apply(core: np.ndarray, feats, w: Sequence[float]) -> np.ndarray:
    a, b, c, d = (np.float32(v) for v in w)
    lg, hi, lo = feats
    z = a * lg + b * hi + c * lo + d
    with np.errstate(over="ignore"):  # exp overflows to inf where z is very negative: p' = 0
        out = (1.0 / (1.0 + np.exp(-z, dtype=np.float32))).astype(np.float32)
    out[np.asarray(core) == 0] = 0.0  # what the run cleared stays cleared
    return out


def mix_slab(read: Callable[[int, int], np.ndarray], a: int, b: int, nz: int, zmix: dict) -> np.ndarray:
    """The refitted probabilities of slices ``a:b`` of a volume of ``nz`` slices, read through
    ``read(z0, z1)`` (the slab, then one slice each side, each read on its own)."""
    core = read(a, b)
    prev = read(a - 1, a) if a > 0 else core[:1]
    nxt = read(b, b + 1) if b < nz else core[-1:]
    return _apply(core, zmix_features(prev, core, nxt), zmix["w"])


def mix_volume(prob: np.ndarray, zmix: Optional[dict]) -> np.ndarray:
    """The refitted probabilities of a whole in-memory volume (``prob`` itself without ``zmix``)."""
    prob = np.asarray(prob, np.float32)
    if zmix is None:
        return prob
    return mix_slab(lambda a, b: prob[a:b], 0, prob.shape[0], prob.shape[0], zmix)


def fit_zmix(probs: Sequence[np.ndarray], truths: Sequence[np.ndarray], wheres: Sequence[np.ndarray],
             iterations: int = 30, ridge: float = 1e-6) -> dict:
    """``{"w": [a, b, c, d]}`` minimizing the cross-entropy of the refitted probability against
    ``truths`` (bool) on the voxels ``wheres`` (bool masks) of the raw volumes ``probs``.

    Newton's method from the identity, a tiny ridge for a well-posed step; voxels that the run
    cleared (probability 0) are left out, as the map leaves them 0."""
    xs, ys = [], []
    for prob, truth, where in zip(probs, truths, wheres):
        prob = np.asarray(prob, np.float32)
        planes = np.flatnonzero(np.asarray(where).reshape(where.shape[0], -1).any(axis=1))
        for z in planes:
            prev = prob[z - 1: z] if z > 0 else prob[z: z + 1]
            nxt = prob[z + 1: z + 2] if z + 1 < prob.shape[0] else prob[z: z + 1]
            feats = zmix_features(prev, prob[z: z + 1], nxt)
            m = where[z] & (prob[z] > 0)
            xs.append(np.stack([f[0][m] for f in feats] + [np.ones(int(m.sum()), np.float32)], 1))
            ys.append(np.asarray(truth[z])[m])
    x = np.concatenate(xs).astype(np.float64) if xs else np.zeros((0, 4))
    y = np.concatenate(ys).astype(np.float64) if ys else np.zeros(0)
    w = np.array([1.0, 0.0, 0.0, 0.0])
    if y.size == 0 or y.min() == y.max():
        return {"w": w.tolist()}
    for _ in range(iterations):
        with np.errstate(over="ignore"):  # exp overflows to inf where a voxel is certain: p = 0
            p = 1.0 / (1.0 + np.exp(-(x @ w)))
        grad = x.T @ (p - y) + ridge * w
        hess = (x * (p * (1.0 - p))[:, None]).T @ x + ridge * np.eye(4)
        step = np.linalg.solve(hess, grad)
        w = w - step
        if np.abs(step).max() < 1e-8:
            break
    return {"w": [float(v) for v in w]}
