"""The sample and its outside: which voxels of a scan are the material, found by its shape.

Real scans are mostly cylindrical cores (often off the rotation axis, often in a plastic or aluminium
tube, sometimes cut by a circular field of view), or blocks, with the reconstruction's empty or
air-filled outside around them. Counting that outside as pore gives a confidently wrong porosity, so
every figure of ctpore is of the sample only. :func:`find_sample` reads a few slices once and says
where the sample is (:class:`SampleFit`); :meth:`SampleFit.outside` then marks the outside slab by
slab:

``constant``
    Most of the slices' border holds one exact grey value (what a reconstruction writes beyond its
    field of view, often 0) that is rare in the middle: that value, connected to the border, is
    outside (and left out of every statistic of the fit).
``cylinder``
    A core: a cylinder fitted to the material's surface in sector profiles
    (:mod:`ctpore.data.envelope`), a container wall and the air between it and the core left out.
``outline``
    A sample that is not a cylinder (a block, a prism): the convex hull of its material, slab by slab.
``dark``
    No shape could be fitted, but the border is nearly uniform and darker than anything in the middle:
    what is that dark and connected to the border is outside (judged by grey value alone, so the
    result is flagged as uncertain).

The grey-value rules (``constant``, ``dark``) are in :mod:`ctpore.data.grey_outside`.

An air outside is as dark as a dry sample's pores; the shape tells them apart where the grey value
cannot. A scan whose border is material on every side (a block of rock filling the volume) has no
outside: every voxel is sample, and its figures are exactly those of the whole volume.

Examples
--------
>>> rng = np.random.default_rng(0)
>>> scan = rng.normal(1000, 50, (6, 40, 40)).astype(np.float32)
>>> zz, yy, xx = np.indices(scan.shape)
>>> scan[(yy - 19.5) ** 2 + (xx - 19.5) ** 2 > 17 ** 2] = 0        # a core inside a zero outside
>>> fit = find_sample(scan)
>>> fit.kind, fit.constant
('constant', 0.0)
>>> inside = fit.outside(scan, 0)[0] == 0
>>> int(inside.sum()) == int(((yy - 19.5) ** 2 + (xx - 19.5) ** 2 <= 17 ** 2).sum())
True
>>> find_sample(rng.normal(1000, 50, (6, 40, 40))).kind        # material up to the border
'none'
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ctpore.data.binary import erode_diamond
from ctpore.data.envelope import Envelope, cylinder_spread_limit, cylinder_stray, fit_envelope, sample_slices
from ctpore.data.face import FACE_NOTE
from ctpore.data.grey_outside import DarkRule, connected_to_border, constant_level, dark_outside, dark_rule
from ctpore.data.layer import LAYER_NOTE, POROUS_WALL_NOTE, take_pore_free_layer
from ctpore.data.outline import OUTLINE_STRAY
from ctpore.data.profiles import PROFILE_PIXELS
from ctpore.data.wall import THIN_WALL_NOTE

__all__ = ["AIR_SLICE", "BEYOND", "EDGE_PORES", "KINDS", "SURFACE", "WALL", "SampleFit", "find_sample"]

#: What :attr:`SampleFit.kind` may be.
KINDS = ("none", "constant", "cylinder", "outline", "dark")

#: The codes of :meth:`SampleFit.outside` (0 is the sample): outside across the sample's surface facing
#: air; across no surface (a field of view's cut, a margin taken off); a container's wall or a gap too
#: thin to show air: the voxels the sample shares with a grey wall, or with such a gap, are darker than
#: its material, a rim like air's (:func:`~ctpore.data.rim.clear_rim` clears both; the check reads air's).
SURFACE, BEYOND, WALL = 1, 2, 3

#: A slice whose voxels inside the shape average less than this share of the way from the air's
#: grey level to the material's is air (above or below the sample), not sample.
AIR_SLICE = 0.125

#: An outline that is not confident, whose surface points are fewer than this share of its sectors,
#: is no outside: a scan whose material reaches the border, with a few pores of 3 voxels or more open
#: at the slice's edge (each such sector shows "air outside the material"). Plain development scans
#: gave such outlines at a share of 0.04 to 0.19; blocks in air 0.68 or more.
EDGE_PORES = 0.25

#: How the fit's notes begin the reason an outline was dropped by :data:`EDGE_PORES` (``describe`` says it).
_EDGE_NOTE = "air seen in only"


@dataclass
class SampleFit:
    """Where the sample is (:func:`find_sample`), fitted once and used by every later step.

    Attributes
    ----------
    shape : tuple of int
        ``(Z, Y, X)`` of the scan.
    spacing_mm : tuple of float
        Voxel size (z, y, x) the geometry is in.
    constant : float or None
        The grey value beyond a field of view (``constant`` outside), if any.
    envelope : Envelope
        The fitted shape (:func:`~ctpore.data.envelope.fit_envelope`).
    dark : DarkRule or None
        The grey-value rule used when no shape fits (``kind == "dark"``).
    """

    shape: tuple
    spacing_mm: tuple
    constant: Optional[float]
    envelope: Envelope
    dark: Optional[DarkRule] = None
    checks: dict = field(default_factory=dict)

    @property
    def kind(self) -> str:
        if self.envelope.kind in ("cylinder", "outline"):
            return self.envelope.kind
        if self.dark is not None:
            return "dark"
        return "constant" if self.constant is not None else "none"

    @property
    def has_outside(self) -> bool:
        return self.kind != "none"

    @property
    def confident(self) -> bool:
        """Whether the outside rests on a shape that fits (else the result is said to be uncertain)."""
        env = self.envelope
        if self.kind == "dark":
            return False
        # every sector either shows the surface or is cut by the slice's edge, and no material lies
        # just outside a cylinder
        seen = env.points + env.cut >= 0.5 * max(env.sectors, 1)
        if self.kind == "cylinder":
            # inside a wall the sample stays a cylinder however its surface points spread: they must
            # still spread little about it (twice what makes a sample in air a cylinder)
            held = env.spread_vox <= 2.0 * cylinder_spread_limit(env.cylinder.radius_mm, min(self.spacing_mm[1:]))
            thin = env.note(THIN_WALL_NOTE) is not None  # a wall it could not resolve
            return env.points >= 8 and seen and held and self.checks.get("stray", 0.0) <= 0.2 and not thin
        if self.kind == "outline":  # and it leaves no material outside it
            return seen and self.checks.get("stray", 0.0) <= OUTLINE_STRAY
        return True

    def _inside_shape(self, raw: np.ndarray, z0: int, valid) -> Optional[np.ndarray]:
        env = self.envelope
        n, ny, nx = raw.shape
        if env.kind == "cylinder":
            return np.stack([env.cylinder.inside(float(z0 + i), (ny, nx), self.spacing_mm[1:]) for i in range(n)])
        if env.kind == "outline":
            return env.outline.inside(raw, z0, self.spacing_mm, valid)
        return None

    def outside(self, raw: np.ndarray, z0: int, margin: int = 0) -> tuple[np.ndarray, dict]:
        """uint8 ``(n, Y, X)`` for the slices ``z0 : z0 + n`` of raw grey values: 0 in the sample,
        :data:`SURFACE` outside it across the sample's air surface (what a shape, or the dark rule,
        left out; a slice of air above or below the sample), :data:`WALL` a container's wall and a
        gap too thin to show air, :data:`BEYOND` outside it across no surface (a field of view's
        constant outside, where a shape was found; the band a margin took off); and counts of those
        voxels:
        ``region``, what the shape left out apart from the constant outside and a wall (the voxels
        that would be pore if the shape were wrong), and ``wall``.

        ``margin``: the sample is eroded by that many voxels within each slice (a damaged rim), from
        its surface: a cut face (the slice's edge, a field of view's) stays where it is.
        """
        raw = np.asarray(raw, np.float32)
        n = raw.shape[0]
        const = np.zeros(raw.shape, bool)
        if self.constant is not None:
            for i in range(n):
                const[i] = connected_to_border(raw[i] == self.constant)
        valid = None if self.constant is None else list(~const)
        inside = self._inside_shape(raw, z0, valid)
        shaped = inside is not None
        if shaped:
            inside &= self._material_slices(raw, inside & ~const)[:, None, None]
        elif self.dark is not None:
            inside = ~dark_outside(raw, self.dark)
            shaped = True
        else:
            inside = np.ones(raw.shape, bool)
        region = ~inside & ~const
        wall = self._wall(raw.shape, z0)
        n_wall = 0
        if wall is not None:
            wall &= ~const
            region &= ~wall
            n_wall = int(np.count_nonzero(wall))
        sample = inside & ~const
        codes = np.where(sample, 0, SURFACE).astype(np.uint8)
        if shaped:
            codes[const] = BEYOND  # the constant is a field of view's cut, the shape the surface
        if wall is not None:  # a wall touching the sample, and a gap thinner than a voxel: no air to be seen
            codes[wall] = WALL
            for i in range(n):
                codes[i][(codes[i] == SURFACE) & self._thin_gap(float(z0 + i), raw.shape[1:])] = WALL
        if margin > 0:
            for i in range(n):  # eroded from the surface only: a cut face counts as sample here
                codes[i][sample[i] & ~erode_diamond(sample[i] | (codes[i] == BEYOND), int(margin))] = BEYOND
        return codes, {"region": int(np.count_nonzero(region)), "wall": n_wall}

    def _thin_gap(self, z: float, shape_yx: tuple) -> np.ndarray:
        """Bool ``(Y, X)``: the pixels whose direction from the sample's axis meets the wall's inner
        surface less than a voxel beyond the sample's (where the sample touches its container)."""
        c, wall = self.envelope.cylinder, self.envelope.wall
        cy, cx = c.centre_at(z)
        wy, wx = wall["outer"].centre_at(z)
        y = np.arange(shape_yx[0])[:, None] * self.spacing_mm[1] - cy
        x = np.arange(shape_yx[1])[None, :] * self.spacing_mm[2] - cx
        r = np.maximum(np.hypot(y, x), 1e-12)
        uy, ux = y / r, x / r
        oy, ox = cy - wy, cx - wx  # the ray c + t u meets the circle |p - w| = r_in at t_in
        b = oy * uy + ox * ux
        t_in = -b + np.sqrt(np.maximum(b * b - (oy * oy + ox * ox - wall["r_in"] ** 2), 0.0))
        return t_in - c.radius_mm < min(self.spacing_mm[1:])

    def _material_slices(self, raw: np.ndarray, inside: np.ndarray) -> np.ndarray:
        """Bool ``(n,)``: the slices whose voxels inside the shape are, on average, material (above
        an eighth of the way from the air's level to the material's): a slice of air above or
        below a core, or of zeros padding the stack, holds no sample."""
        lv = self.envelope.levels
        if "air" not in lv or "material" not in lv:
            return np.ones(raw.shape[0], bool)
        level = lv["air"] + AIR_SLICE * (lv["material"] - lv["air"])
        out = np.ones(raw.shape[0], bool)
        for i in range(raw.shape[0]):
            if inside[i].any():
                out[i] = float(raw[i][inside[i]].mean()) > level
        return out

    def _wall(self, shape, z0: int) -> Optional[np.ndarray]:
        wall = self.envelope.wall
        if wall is None:
            return None
        n, ny, nx = shape
        outer, sp = wall["outer"], self.spacing_mm[1:]
        # the wall's own surfaces about the outer fit's axis: its outer one may lie a little beyond the
        # outermost surface found (where that surface was the sample's, the wall darker than it)
        out, inn = outer.radius_mm - wall["r_out"], outer.radius_mm - wall["r_in"]
        return np.stack([outer.inside(float(z0 + i), (ny, nx), sp, shrink_mm=out)
                         & ~outer.inside(float(z0 + i), (ny, nx), sp, shrink_mm=inn) for i in range(n)])

    def _length(self, units_known: bool) -> tuple[float, str]:
        """(factor, unit) for the fit's lengths: mm, or voxels (of the in-plane pixel) when the scan
        gives no length unit (its spacing is then only its own numbers)."""
        return (1.0, "mm") if units_known else (1.0 / min(self.spacing_mm[1:]), "vox")

    def describe(self, units_known: bool = True) -> str:
        """How the sample was found, in words (for the metrics and the warnings)."""
        env, kind = self.envelope, self.kind
        f, unit = self._length(units_known)
        unit = "mm" if unit == "mm" else "voxels"
        fov = (f" within a field of view whose outside holds the constant grey value {self.constant:g}"
               if self.constant is not None else "")
        if kind == "none":
            edge = env.note(_EDGE_NOTE)
            return "no outside: the material reaches the border" + (f" ({edge})" if edge else "")
        if kind == "constant":
            return f"the constant grey value {self.constant:g} connected to the slices' border"
        if kind == "cylinder":
            c = env.cylinder
            cy, cx = c.centre_at(c.z_ref)
            text = (f"a cylinder of radius {f * c.radius_mm:.4g} {unit} about ({f * cy:.4g}, {f * cx:.4g}) {unit} "
                    f"(y, x) fitted to the material's surface (spread {env.spread_vox:.2f} voxels over {env.points} "
                    f"of {env.sectors} sectors)")
            if env.wall is not None:
                text += f", inside a container wall {f * env.wall['thickness_mm']:.3g} {unit} thick"
            notes = "; ".join(n for n in map(env.note, (THIN_WALL_NOTE, LAYER_NOTE, POROUS_WALL_NOTE)) if n)
            return text + fov + (f" ({notes})" if notes else "")
        if kind == "outline":
            why = "; ".join(n for n in map(env.note, (FACE_NOTE, POROUS_WALL_NOTE)) if n)
            return "the outline (convex hull) of the material, slab by slab" + fov + (f" ({why})" if why else "")
        return ("grey values up to {:g} connected to the slices' border (no shape fits: uncertain)"
                .format(self.dark.upper))

    def info(self, units_known: bool = True) -> dict:
        """The geometry for the metrics: kind, confidence, fitted sizes in mm (keys ``_mm``; in voxels,
        keys ``_vox``, when the scan gives no length unit), fit spread in voxels."""
        env = self.envelope
        f, u = self._length(units_known)
        d: dict = {"kind": self.kind, "confident": bool(self.confident)}
        if self.constant is not None:
            d["field_of_view_value"] = self.constant
        if self.kind in ("cylinder", "outline"):
            c = env.cylinder
            d["fit"] = {"spread_vox": _r(env.spread_vox), "sectors": int(env.sectors),
                        "surface_points": int(env.points), "cut_sectors": int(env.cut),
                        "stray_material": _r(self.checks.get("stray", 0.0))}
            if self.kind == "cylinder":
                cy, cx = c.centre_at(c.z_ref)
                tilt = [c.drift_mm[0] / self.spacing_mm[0], c.drift_mm[1] / self.spacing_mm[0]]
                d["cylinder"] = {f"centre_{u}_yx": [_r(f * cy), _r(f * cx)], "at_slice": _r(c.z_ref),
                                 f"radius_{u}": _r(f * c.radius_mm), "axis_tilt_yx": [_r(t) for t in tilt]}
        if env.wall is not None:
            w = env.wall
            oy, ox = w["outer"].centre_at(w["outer"].z_ref)
            d["wall"] = {f"outer_radius_{u}": _r(f * w["r_out"]), f"thickness_{u}": _r(f * w["thickness_mm"]),
                         f"centre_{u}_yx": [_r(f * oy), _r(f * ox)], "grey_level": _r(w["level"])}
        d["levels"] = {k: _r(v) for k, v in env.levels.items()}
        return d


def _r(v: float, digits: int = 5) -> float:
    return float(f"{float(v):.{digits}g}") if math.isfinite(float(v)) else float("nan")


def _weakrefable(volume) -> bool:
    return not isinstance(volume, np.ndarray) and hasattr(volume, "__weakref__")


#: find_sample's answer per scan object (a Scan, not an array, whose contents may change).
_FITS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _clipped(slices, valid) -> list:
    """The slices with grey values far outside their robust range (a block of 1e30 from a failed
    reconstruction, a metal inclusion) clipped to one whole range beyond it, as the normalization
    does: so few voxels must not become the "material" the shape is fitted to."""
    from ctpore.data.normalize import CLIP_HIGH, CLIP_LOW, robust_range

    outside = None if all(ok is None for ok in valid) else np.stack(
        [np.zeros(sl.shape, bool) if ok is None else ~ok for sl, ok in zip(slices, valid)])
    lo, hi = robust_range(np.stack(slices), max_slices=len(slices), outside=outside)
    w = hi - lo
    return [np.clip(sl, lo + CLIP_LOW * w, hi + (CLIP_HIGH - 1.0) * w) for sl in slices]


def find_sample(volume, spacing_mm=None, max_slices: Optional[int] = None) -> SampleFit:
    """Where the sample is in a scan (see the module docstring).

    Parameters
    ----------
    volume : array_like or Scan
        Raw grey values ``(Z, Y, X)``, sliceable along Z (``volume[z0:z1]``).
    spacing_mm : tuple of float, optional
        Voxel size (z, y, x); a Scan's own by default, else isotropic.
    max_slices : int, optional
        At most this many slices, evenly spaced, are read (default
        :data:`~ctpore.data.envelope.MAX_SLICES`).
    """
    from ctpore.data.envelope import MAX_SLICES

    nz, ny, nx = (int(s) for s in volume.shape)
    if spacing_mm is None:
        geometry = getattr(volume, "geometry", None)
        spacing_mm = geometry.spacing_mm if geometry is not None else (1.0, 1.0, 1.0)
    spacing = tuple(float(s) for s in spacing_mm)
    n_max = MAX_SLICES if max_slices is None else int(max_slices)
    key = (spacing, n_max)
    cached = _FITS.get(volume, {}) if _weakrefable(volume) else {}
    if key in cached:
        return cached[key]
    none = SampleFit((nz, ny, nx), spacing, None, Envelope("none"))
    if ny < 8 or nx < 8:
        return none
    zs = sample_slices(nz, n_max)
    # a large slice is kept on a grid of every `step`-th pixel (its spacing `step` times larger): the
    # fit's memory and time stay bounded, and its geometry is in mm whatever the grid
    step = max(1, int(round(math.sqrt(ny * nx / PROFILE_PIXELS))))
    slices = [np.ascontiguousarray(np.asarray(volume[int(z): int(z) + 1], dtype=np.float32)[0][::step, ::step])
              for z in zs]
    grid = (spacing[0], spacing[1] * step, spacing[2] * step)
    constant = constant_level(slices)
    valid = [None] * len(slices)
    if constant is not None:
        valid = [~connected_to_border(sl == constant) for sl in slices]
    slices = _clipped(slices, valid)
    env = fit_envelope(slices, zs, grid, valid)
    env.zs = zs
    fit = SampleFit((nz, ny, nx), spacing, constant, env)
    if env.kind == "cylinder":
        fit.checks["stray"] = cylinder_stray(slices, valid, env, grid)
        if fit.checks["stray"] > 0.2 and env.wall is None:
            # the cylinder cuts through material: not the sample's surface; take the outline
            from ctpore.data.outline import Outline

            px = min(spacing[1], spacing[2])
            k = int(np.clip(2 * np.pi * env.cylinder.radius_mm / (4.0 * px), 64, 360))
            lv = env.levels
            env.kind = "outline"
            env.outline = Outline(env.cylinder, k, lv["air"], lv["air"] + 0.25 * (lv["material"] - lv["air"]),
                                  lv["material"])
    if env.kind == "cylinder":  # a wall as grey as the material, touching the core: it has no pores
        take_pore_free_layer(env, slices, valid, grid)
    if env.kind == "outline":  # a block or not, decided once on the fit's slices; what it leaves out
        env.outline = env.outline.judge_block(slices, valid)
        fit.checks["stray"] = env.outline.stray(slices, valid, zs, grid)
        if not fit.confident and env.points < EDGE_PORES * env.sectors:
            # a few sectors ending in a pore at the slice's edge, the rest cut: material to the border
            env.kind = "none"
            env.notes.append(f"{_EDGE_NOTE} {env.points} of {env.sectors} directions, at the slice's edge: "
                             "pores open at the edge, not an outside")
    if env.kind == "none" and constant is None:
        fit.dark = dark_rule(slices)
    if _weakrefable(volume):
        _FITS.setdefault(volume, {})[key] = fit  # a run asks twice (the disk estimate, the mask)
    return fit


