"""From pore probabilities to pores: the one post-processing every method, path and tool applies.

:class:`Postprocessing` holds what turns a method's raw pore probabilities into its outputs:

``threshold``
    A voxel is pore where its raw probability is at least this.
``confidence``
    Decide by the evidence, not by size. A pore component (26-connected) is kept only when its
    most confident voxel reaches ``confidence``; a solid component (6-connected) is kept only when
    its most confident voxel reaches it for solid (probability at most ``1 - confidence``), and is
    filled as pore otherwise. A true pore of eight voxels that the model sees with probability
    0.99 stays; a speck of noise the model gives 0.6 goes. None: off.
``min_size``
    The older size rule: pore components and solid islands smaller than this many voxels are
    removed (0 or 1: off). Weights exported before the evidence rule store it.
``min_pore_voxels``
    A user's own size rule (``--min-pore-voxels``): pore components smaller than this go.
``calibration``
    The monotone map applied to the probability map (:mod:`ctpore.data.calibration`); the pores
    are always decided on the raw probability.
``zmix``
    The z-neighbour refit (:mod:`ctpore.data.zmix`), fitted on a user's labels by ``ctpore
    finetune``: applied to the raw probabilities first (every rule and the calibration then act
    on its output), each slab read with one slice of halo on each side. None: off. With
    ``"pores": "raw"`` in it, the pores are decided on the raw probabilities and the refit shapes
    the probability map alone (the fine-tuning refit chooses which by the labels' topology).
``binary``
    The method gives 0/1 pores, not probabilities (the thresholding methods): its probability map
    is its final pores.

:meth:`Postprocessing.run` applies it slab by slab along z to probabilities of any size (they are
read twice more when a component rule is on: components are followed across slabs by
:class:`~ctpore.data.slabs.SlabComponents`), so the pores equal those of the whole volume.
:meth:`Postprocessing.apply` does the same on an in-memory array.

Examples
--------
>>> prob = np.zeros((5, 9, 9), np.float32)
>>> prob[2, 2, 2] = 0.6                       # a faint speck
>>> prob[2, 5:7, 5:7] = 0.99                  # a small pore the model is sure of
>>> pores, _ = Postprocessing(confidence=0.9).apply(prob)
>>> int(pores.sum()), int(Postprocessing().apply(prob)[0].sum())
(4, 5)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

import numpy as np

from ctpore.data.calibration import apply_calibration
from ctpore.data.slabs import SlabComponents
from ctpore.data.topology import SLAB_VOXELS
from ctpore.data.zmix import mix_slab
from ctpore.errors import InputError
from ctpore.progress import ProgressFn

__all__ = ["Postprocessing", "slab_cuts", "whole_slab"]

#: ``on_slab(start, stop, pores, prob)``: receives each slab's final uint8 pores and probabilities.
SlabFn = Callable[[int, int, np.ndarray, np.ndarray], None]


def slab_cuts(nz: int, slab: int) -> list[tuple[int, int]]:
    """``[(0, slab), (slab, 2 slab), ...]`` covering ``nz`` slices."""
    return [(a, min(nz, a + slab)) for a in range(0, nz, max(1, int(slab)))]


@dataclass(frozen=True)
class Postprocessing:
    """What turns raw pore probabilities into pores and a probability map (see the module docstring).

    Attributes
    ----------
    threshold : float
    confidence : float or None
    min_size : int
    min_pore_voxels : int
    calibration : dict or None
    binary : bool
    zmix : dict or None
    """

    threshold: float = 0.5
    confidence: Optional[float] = None
    min_size: int = 0
    min_pore_voxels: int = 0
    calibration: Optional[dict] = field(default=None, compare=False)
    binary: bool = False
    zmix: Optional[dict] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not (isinstance(self.threshold, (int, float)) and 0.0 < float(self.threshold) <= 1.0):
            raise InputError(f"the threshold must be a probability in (0, 1], got {self.threshold!r}")
        if self.confidence is not None and not (math.isfinite(self.confidence) and 0.5 <= self.confidence <= 1.0):
            raise InputError(f"the confidence must lie in [0.5, 1] (or be None: off), got {self.confidence!r}")
        for name in ("min_size", "min_pore_voxels"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise InputError(f"{name} must be a whole number of voxels >= 0, got {v!r}")
        if self.zmix is not None:
            w = self.zmix.get("w") if isinstance(self.zmix, dict) else None
            if not isinstance(w, (list, tuple)) or len(w) != 4 or not all(math.isfinite(float(v)) for v in w):
                raise InputError(f"the z-neighbour refit needs four finite numbers under 'w', got {self.zmix!r}")
            if self.zmix.get("pores", "refit") not in ("refit", "raw"):
                raise InputError(f"the z-neighbour refit's 'pores' is 'refit' or 'raw', got {self.zmix['pores']!r}")

    # -- what it does -------------------------------------------------------------------------

    @property
    def pore_rule(self) -> bool:
        """Whether some pore components may be removed (a component pass is needed)."""
        return self.min_size > 1 or self.min_pore_voxels > 1 or self.confidence is not None

    @property
    def pores_on_raw(self) -> bool:
        """Whether the pores are decided on the raw probabilities while the z-neighbour refit
        shapes the probability map alone."""
        return self.zmix is not None and not self.binary and self.zmix.get("pores") == "raw"

    @property
    def solid_rule(self) -> bool:
        """Whether some solid components may be filled."""
        return self.min_size > 1 or self.confidence is not None

    def with_user_rules(self, min_pore_voxels: Optional[int] = None) -> "Postprocessing":
        """This post-processing with a user's ``--min-pore-voxels`` (None: unchanged)."""
        return self if min_pore_voxels is None else replace(self, min_pore_voxels=int(min_pore_voxels))

    def describe(self) -> dict:
        """The rules as the metrics record them (the calibration only as whether there is one)."""
        return {"threshold": float(self.threshold), "confidence": self.confidence, "min_size": int(self.min_size),
                "min_pore_voxels": int(self.min_pore_voxels), "calibrated": self.calibration is not None,
                **({} if self.zmix is None else {"z_neighbour_refit": [round(float(v), 4) for v in self.zmix["w"]],
                                                 "pores_on": "raw" if self.pores_on_raw else "z-refit"})}

    # -- stored with weights ------------------------------------------------------------------

    def to_metadata(self) -> dict[str, str]:
        """String metadata for a weights file (the keys :meth:`from_metadata` reads)."""
        return {"threshold": str(self.threshold), "min_size": str(self.min_size),
                "confidence": "" if self.confidence is None else str(self.confidence),
                "calibration": json.dumps(self.calibration), "zmix": json.dumps(self.zmix)}

    @classmethod
    def from_metadata(cls, meta: dict, path=None) -> "Postprocessing":
        """The post-processing stored in a weights file's metadata (defaults where none is stored).

        Raises
        ------
        InputError
            For a malformed stored value; the message names ``path`` and says how to refit.
        """
        try:
            raw = meta.get("calibration")
            cal = None
            if raw not in (None, "", "null"):
                cal = json.loads(raw) if isinstance(raw, str) else raw
                x, y = cal.get("x"), cal.get("y")
                if not x or not y or len(x) != len(y):
                    raise ValueError("the stored calibration needs x and y of equal, non-zero length")
            conf = meta.get("confidence")
            raw_mix = meta.get("zmix")
            zmix = None if raw_mix in (None, "", "null") else (json.loads(raw_mix) if isinstance(raw_mix, str)
                                                                else raw_mix)
            return cls(threshold=float(meta.get("threshold", 0.5)), min_size=int(meta.get("min_size", 0)),
                       confidence=None if conf in (None, "", "None", "null") else float(conf), calibration=cal,
                       zmix=zmix)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise InputError(f"the stored post-processing is malformed ({exc}); refit it with "
                             "ctpore.pipelines.train.refit_postprocessing", path=path) from None

    # -- applying it ----------------------------------------------------------------------------

    def apply(self, prob: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(pores uint8, probability float32)`` of a whole in-memory ``(Z, Y, X)`` probability
        volume: the same as :meth:`run` slab by slab. ``prob`` is left unchanged."""
        prob = np.asarray(prob, np.float32)
        pores = np.empty(prob.shape, np.uint8)
        out = np.empty(prob.shape, np.float32)

        def keep(a, b, p, q):
            pores[a:b], out[a:b] = p, q

        self.run(lambda a, b: prob[a:b].copy(), prob.shape, whole_slab(prob.shape), keep)
        return pores, out

    def mixing(self, read: Callable[[int, int], np.ndarray], nz: int) -> Callable[[int, int], np.ndarray]:
        """``read`` with the z-neighbour refit applied (``read`` itself without one): ``read(z0, z1)``
        of a volume of ``nz`` slices, each slab read with one slice of halo on each side."""
        if self.zmix is None or self.binary:
            return read
        zmix = self.zmix
        return lambda a, b: mix_slab(read, a, b, nz, zmix)

    def run(self, read: Callable[[int, int], np.ndarray], shape, slab: int, on_slab: SlabFn,
            progress: ProgressFn = None) -> None:
        """Post-process probabilities read slab by slab, and hand each final slab to ``on_slab``.

        Parameters
        ----------
        read : callable
            ``read(z0, z1)`` -> raw probabilities of slices ``z0:z1``, float32 ``(n, Y, X)``, a
            fresh array each call (it is calibrated in place).
        shape : tuple
            ``(Z, Y, X)``.
        slab : int
            Slices per slab (memory grows with it; the result does not depend on it).
        on_slab : callable
            ``on_slab(z0, z1, pores, prob)`` in z order: uint8 0/1 pores and the (calibrated)
            probabilities of those slices.
        progress : callable, optional
            ``progress(done, total, stage)``.
        """
        mixed = self.mixing(read, int(shape[0]))
        read = read if self.pores_on_raw else mixed  # what the pores are decided on
        cuts = slab_cuts(int(shape[0]), slab)
        steps = len(cuts) * (1 + self.pore_rule + self.solid_rule)
        done = 0

        def tick(stage: str) -> None:
            nonlocal done
            done += 1
            if progress is not None:
                progress(done, steps, stage)

        drop_pore = fill_solid = None
        pores_cc = solid_cc = None
        if self.pore_rule:  # pore components: sizes and most confident voxel, across slabs
            pores_cc = SlabComponents(26)
            for a, b in cuts:
                prob = read(a, b)
                pores_cc.add(prob >= self.threshold, prob if self.confidence is not None else None)
                tick("sizing pores")
            drop_pore = pores_cc.small(max(self.min_size, self.min_pore_voxels))
            if self.confidence is not None:
                drop_pore |= pores_cc.peak_below(self.confidence)
        if self.solid_rule:  # then the solid of what is left: sizes and most confident voxel
            solid_cc = SlabComponents(6)
            for i, (a, b) in enumerate(cuts):
                prob = read(a, b)
                pores = prob >= self.threshold
                if drop_pore is not None:
                    pores &= ~drop_pore[pores_cc.labels(pores, i)]
                solid_cc.add(~pores, (1.0 - prob) if self.confidence is not None else None)
                tick("sizing solid islands")
            fill_solid = solid_cc.small(self.min_size)
            if self.confidence is not None:
                fill_solid |= solid_cc.peak_below(self.confidence)
        for i, (a, b) in enumerate(cuts):
            prob = read(a, b)
            pores = prob >= self.threshold  # on the raw probability
            if drop_pore is not None:
                pores &= ~drop_pore[pores_cc.labels(pores, i)]
            if fill_solid is not None:
                pores |= fill_solid[solid_cc.labels(~pores, i)]
            pores = pores.view(np.uint8)
            if read is not mixed:
                prob = mixed(a, b)
            if self.binary:
                prob = pores.astype(np.float32)
            elif self.calibration is not None:
                apply_calibration(prob, self.calibration, out=prob)
            on_slab(a, b, pores, prob)
            tick("writing pores and metrics")


    def run_split(self, read: Callable[[int, int], np.ndarray], cuts: list[tuple[int, int]],
                  on_slab: Callable[[int, int, np.ndarray, np.ndarray], object],
                  map_fn: Optional[Callable] = None, groups: Optional[list[list[int]]] = None) -> list:
        """:meth:`run` with each slab's work done on its own, in any order or process: for a scan
        split across workers. The same pores as :meth:`run`, whatever the cuts.

        Each pass maps a function over the groups of cuts (``groups``: lists of consecutive cut
        indices, one task each, its cuts in z order; default one cut a task) with
        ``map_fn(fn, items) -> list`` (default: one after the other here; a Dask client's ``map``
        and ``gather`` on a cluster). A component rule takes two joins: each cut summarizes its pore
        (then solid) components, their sizes, peaks and labels on its two faces
        (:meth:`SlabComponents.summarize`); the caller joins the summaries in z order (a union-find,
        small) and hands each cut the decisions for its own components
        (:meth:`SlabComponents.slab_part`). ``read(z0, z1)`` gives a fresh array each call;
        ``on_slab(z0, z1, pores, prob)`` runs where the cut's last pass runs, and its results are
        returned in the order of ``cuts``.
        """
        run = map_fn or (lambda fn, items: [fn(it) for it in items])
        mixed = self.mixing(read, int(cuts[-1][1]) if cuts else 0)
        read = read if self.pores_on_raw else mixed  # what the pores are decided on
        groups = groups if groups is not None else [[i] for i in range(len(cuts))]
        if sorted(i for g in groups for i in g) != list(range(len(cuts))):
            raise ValueError("the groups must hold every cut once")
        thr, conf = self.threshold, self.confidence
        # what a cut's work needs is sent with it: stateless labellers, never the union-finds
        pore_labels, solid_labels = SlabComponents(26), SlabComponents(6)
        drop = fill = [None] * len(cuts)

        def each(fn):  # fn(cut, its part of every decision) over the groups, joined back in cut order
            tasks = [[(cuts[i], drop[i], fill[i]) for i in g] for g in groups]
            done = run(lambda task: [fn(*item) for item in task], tasks)
            out = [None] * len(cuts)
            for g, results in zip(groups, done):
                for i, r in zip(g, results):
                    out[i] = r
            return out

        def pores_of(ab, drop_i):
            prob = read(*ab)
            pores = prob >= thr
            if drop_i is not None:
                pores &= ~drop_i[pore_labels.own_labels(pores)]
            return prob, pores

        if self.pore_rule:
            def pore_summary(ab, _drop, _fill):
                prob = read(*ab)
                out = pore_labels.summarize(prob >= thr, prob if conf is not None else None)
                del out["labels"]
                return out

            pores_cc = SlabComponents(26)
            for summary in each(pore_summary):
                pores_cc.join(summary)
            drop_pore = pores_cc.small(max(self.min_size, self.min_pore_voxels))
            if conf is not None:
                drop_pore |= pores_cc.peak_below(conf)
            drop = [pores_cc.slab_part(drop_pore, i) for i in range(len(cuts))]
        if self.solid_rule:
            def solid_summary(ab, drop_i, _fill):
                prob, pores = pores_of(ab, drop_i)
                out = solid_labels.summarize(~pores, (1.0 - prob) if conf is not None else None)
                del out["labels"]
                return out

            solid_cc = SlabComponents(6)
            for summary in each(solid_summary):
                solid_cc.join(summary)
            fill_solid = solid_cc.small(self.min_size)
            if conf is not None:
                fill_solid |= solid_cc.peak_below(conf)
            fill = [solid_cc.slab_part(fill_solid, i) for i in range(len(cuts))]

        def final(ab, drop_i, fill_i):
            prob, pores = pores_of(ab, drop_i)
            if fill_i is not None:
                pores |= fill_i[solid_labels.own_labels(~pores)]
            pores = pores.view(np.uint8)
            if read is not mixed:
                prob = mixed(*ab)
            if self.binary:
                prob = pores.astype(np.float32)
            elif self.calibration is not None:
                apply_calibration(prob, self.calibration, out=prob)
            return on_slab(ab[0], ab[1], pores, prob)

        return each(final)


def whole_slab(shape) -> int:
    """Slices per slab for an in-memory volume: about :data:`SLAB_VOXELS` voxels a slab."""
    return max(1, SLAB_VOXELS // max(1, int(shape[1]) * int(shape[2])))
