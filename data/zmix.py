"""The z-neighbour refit: a voxel's probability refitted from its own logit and its two z-neighbours'.

A labeller's idea of where a pore ends differs from the model's, and not only by a threshold: one
labeller calls pore a voxel that a pore one slice above or below reaches (a 3D dilation), another
does not. A network that looks only backwards along Z (PoreFormer is causal) cannot learn the slice
below from a few labelled slices. This map can: with ``l`` the logit of the raw probability,

    p' = sigmoid(a * l(z) + b * max(l(z - 1), l(z + 1)) + c * min(l(z - 1), l(z + 1)) + d)

(the max and min make it symmetric in up and down). ``(a, b, c, d)`` are fitted on the labelled
voxels by logistic regression (:func:`fit_zmix`: Newton's method with halved steps, pulled gently
towards the identity, deterministic); ``(1, 0, 0, 0)`` is
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

#: How strongly :func:`fit_zmix` pulls the numbers towards the identity (per unit of the mean
#: cross-entropy): a change of 1 in a number costs as much as 5e-4 of mean cross-entropy.
SHRINK = 1e-3


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
             iterations: int = 50, shrink: float = SHRINK) -> dict:
    """``{"w": [a, b, c, d]}`` minimizing the mean cross-entropy of the refitted probability against
    ``truths`` (bool) on the voxels ``wheres`` (bool masks) of the raw volumes ``probs``, plus
    ``shrink / 2`` times the squared distance of the numbers from the identity ``(1, 0, 0, 0)``.

    Newton's method from the identity, each step halved until the objective falls (so it never
    diverges: a model sure of everything gives logits stuck at the clip, near-singular steps). The
    shrink keeps the numbers finite where the labels split exactly at some probability. Voxels that
    the run cleared (probability 0) are left out, as the map leaves them 0."""
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
    w0 = np.array([1.0, 0.0, 0.0, 0.0])
    if y.size == 0 or y.min() == y.max():
        return {"w": w0.tolist()}
    n = float(y.size)

    def objective(w):
        s = x @ w
        return float(np.sum(np.logaddexp(0.0, s) - y * s) / n + 0.5 * shrink * np.sum((w - w0) ** 2))

    w, f = w0.copy(), objective(w0)
    for _ in range(iterations):
        with np.errstate(over="ignore"):  # exp overflows to inf where a voxel is certain: p = 0
            p = 1.0 / (1.0 + np.exp(-(x @ w)))
        grad = x.T @ (p - y) / n + shrink * (w - w0)
        hess = (x * (p * (1.0 - p))[:, None]).T @ x / n + shrink * np.eye(4)
        step = np.linalg.solve(hess, grad)
        t = 1.0
        while t > 1e-6 and objective(w - t * step) > f:
            t *= 0.5
        if t <= 1e-6:
            break
        w, f_new = w - t * step, objective(w - t * step)
        if f - f_new < 1e-12:
            break
        f = f_new
    return {"w": [float(v) for v in w]}
