"""What a scanner sees around the material: a core or a block in air, a container, a circular field of view.

A simulated pair (:func:`~ctpore.data.synthetic.make_pair`) is, by default, a box filled with porous
material to its border. Real scans rarely are: the commonest is a dry core in air, often off the
rotation axis, often inside a plastic or aluminium tube, sometimes cut by a synchrotron's circular
field of view. A :class:`Scene` says where the sample is and what is around it, in mm; the scanner
model then renders it on the fine grid before its blur and noise, so the sample's surface has a real
partial-volume rim (:func:`scene_fractions`).

The true sample is the voxels whose centre lies inside the sample's geometry (:func:`true_sample`);
the truth is the pores of the material inside it. A scene is drawn from a random stream of its own
(``default_rng([seed, 2])``), so no seed's plain scan changes when scenes are added.

Set-ups
-------
:data:`SETUPS` names the set-ups users meet (``core-air``, ``core-air-offcentre``, ``tube-gap``,
``tube-grey``, ``fov-circle``, ``brine-tube``, ``core-wider-than-fov``, ``block-turned``,
``core-anisotropic``, ``tube-touching``); :meth:`Scene.random` draws any of them with random sizes.

Examples
--------
>>> s = Scene.setup("core-air", (16, 64, 64), spacing_mm=(0.01, 0.01, 0.01))
>>> s.kind, round(s.radius_mm, 3) > 0
('cylinder', True)
>>> inside = true_sample(s, (16, 64, 64))
>>> bool(0.3 < inside.mean() < 0.8)
True
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Optional

import numpy as np

from ctpore.errors import InputError

__all__ = ["SETUPS", "Scene", "scene_fractions", "true_sample", "scene_rng"]

#: The named set-ups of :meth:`Scene.setup`.
SETUPS = ("core-air", "core-air-offcentre", "tube-gap", "tube-grey", "fov-circle", "brine-tube",
          "core-wider-than-fov", "block-turned", "core-anisotropic", "tube-touching")

_KINDS = ("none", "cylinder", "block")


def scene_rng(seed: int) -> np.random.Generator:
    """The random stream of a seed's scene (its own: the pair's stream is ``default_rng(seed)``)."""
    return np.random.default_rng([int(seed), 2])


@dataclass(frozen=True)
class Scene:
    """The sample's geometry and its surroundings, in mm; the sample's axis runs along Z.

    Attributes
    ----------
    kind : {"none", "cylinder", "block"}
        ``none``: the material fills the box (the plain pair).
    spacing_mm : tuple of float
        Voxel size (z, y, x).
    centre_mm : tuple of float
        The axis' offset (y, x) from the slice centre at mid-height.
    radius_mm : float
        A cylinder's radius.
    half_sides_mm : tuple of float
        A block's half sides (along its own axes, before it is turned).
    angle_deg : float
        How far a block is turned in the slice plane.
    tilt : tuple of float
        The axis' drift (y, x) per mm of z (0: upright).
    wall_mm : float
        Thickness of a container wall around the sample (0: none).
    gap_mm : float
        Width of the air between the sample and the wall's inner surface, when the sample sits on the
        container's axis.
    eccentricity : float
        How far the sample sits off the container's axis, as a share of ``gap_mm`` (1: it touches the
        wall on one side).
    eccentric_deg : float
        Towards which side.
    wall_attenuation : float
        The wall's attenuation in contrast units (pore 0, plain solid 1).
    fov_radius_mm : float
        Radius of a circular field of view around the slice centre beyond which the scan holds
        ``fov_value`` (0: no such field).
    fov_value : float
        The grey value beyond the field of view.
    pore_fluid : float
        Attenuation of what fills the pores inside the sample, in contrast units (0: dry, as the air
        outside; brine is about 0.3 to 0.6).
    """

    kind: str = "none"
    spacing_mm: tuple = (0.01, 0.01, 0.01)
    centre_mm: tuple = (0.0, 0.0)
    radius_mm: float = 0.0
    half_sides_mm: tuple = (0.0, 0.0)
    angle_deg: float = 0.0
    tilt: tuple = (0.0, 0.0)
    wall_mm: float = 0.0
    gap_mm: float = 0.0
    eccentricity: float = 0.0
    eccentric_deg: float = 0.0
    wall_attenuation: float = 0.0
    fov_radius_mm: float = 0.0
    fov_value: float = 0.0
    pore_fluid: float = 0.0

    def validate(self) -> "Scene":
        """Raise :class:`InputError` for values outside their meaning; returns self."""
        if self.kind not in _KINDS:
            raise InputError(f"Scene.kind must be one of {_KINDS}, got {self.kind!r}")
        if len(self.spacing_mm) != 3 or not all(s > 0 for s in self.spacing_mm):
            raise InputError(f"Scene.spacing_mm must be three sizes > 0, got {self.spacing_mm!r}")
        if self.kind == "cylinder" and not self.radius_mm > 0:
            raise InputError(f"a cylinder's radius_mm must be > 0, got {self.radius_mm!r}")
        if self.kind == "block" and not min(self.half_sides_mm) > 0:
            raise InputError(f"a block's half_sides_mm must be > 0, got {self.half_sides_mm!r}")
        for name in ("wall_mm", "gap_mm", "fov_radius_mm", "pore_fluid"):
            if getattr(self, name) < 0:
                raise InputError(f"Scene.{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.eccentricity <= 1.0:
            raise InputError(f"Scene.eccentricity must be in [0, 1], got {self.eccentricity!r}")
        return self

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of every field."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Scene":
        """Inverse of :meth:`as_dict` (unknown keys are an :class:`InputError`)."""
        names = {f.name for f in fields(cls)}
        bad = set(d) - names
        if bad:
            raise InputError(f"unknown Scene fields: {sorted(bad)}")
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()}).validate()

    @property
    def container_centre_mm(self) -> tuple[float, float]:
        """The container's axis (y, x) at mid-height: the sample's, moved by the eccentricity."""
        off = self.eccentricity * self.gap_mm
        a = math.radians(self.eccentric_deg)
        return (self.centre_mm[0] - off * math.sin(a), self.centre_mm[1] - off * math.cos(a))

    @classmethod
    def setup(cls, name: str, shape: tuple[int, int, int], spacing_mm: tuple = (0.01, 0.01, 0.01),
              rng: Optional[np.random.Generator] = None) -> "Scene":
        """One of :data:`SETUPS` for a scan of ``shape`` (Z, Y, X); sizes drawn from ``rng`` (None:
        the middle of their ranges)."""
        if name not in SETUPS:
            raise InputError(f"unknown set-up {name!r}; choose one of {', '.join(SETUPS)}")
        r = rng if rng is not None else _Middle()
        sz, sy, sx = (float(s) for s in spacing_mm)
        if name == "core-anisotropic":  # thicker slices, and pixels a little taller than wide
            sz, sy = sx * r.uniform(1.5, 2.5), sx * r.uniform(1.1, 1.4)
        half = min(shape[1] * sy, shape[2] * sx) / 2.0  # half the slice's shorter side, mm
        px = min(sy, sx)
        base = cls(kind="cylinder", spacing_mm=(sz, sy, sx), wall_attenuation=0.0)
        if name in ("core-air", "core-anisotropic"):
            return replace(base, radius_mm=r.uniform(0.6, 0.85) * half,
                           centre_mm=_offset(r, 0.03 * half)).validate()
        if name == "core-air-offcentre":
            rad = r.uniform(0.5, 0.7) * half
            return replace(base, radius_mm=rad, centre_mm=_offset(r, r.uniform(0.5, 0.9) * (half - rad - 3 * px),
                                                                  fixed=rng is None)).validate()
        if name in ("tube-gap", "tube-grey", "brine-tube", "tube-touching"):
            wall = r.uniform(3.0, 8.0) * px
            gap = {"tube-gap": 3.0 * px, "tube-grey": r.uniform(1.0, 4.0) * px, "brine-tube": r.uniform(2.0, 5.0) * px,
                   "tube-touching": r.uniform(0.0, 0.5) * px}[name]
            rad = r.uniform(0.5, 0.65) * half
            room = max(half - rad - gap - wall - 3 * px, 0.0)
            att = {"tube-gap": r.uniform(1.4, 2.5), "tube-grey": r.uniform(0.4, 0.6), "brine-tube": r.uniform(0.6, 1.6),
                   "tube-touching": r.uniform(0.4, 1.8)}[name]
            return replace(base, radius_mm=rad, centre_mm=_offset(r, r.uniform(0.4, 0.9) * room, fixed=rng is None),
                           wall_mm=wall, gap_mm=gap, wall_attenuation=att,
                           eccentricity=r.uniform(0.0, 1.0) if name != "tube-gap" else 0.0,
                           eccentric_deg=r.uniform(0.0, 360.0),
                           pore_fluid=r.uniform(0.3, 0.6) if name == "brine-tube" else 0.0).validate()
        if name == "fov-circle":
            fov = r.uniform(0.92, 1.0) * half
            rad = r.uniform(0.55, 0.75) * fov
            return replace(base, radius_mm=rad, fov_radius_mm=fov,
                           centre_mm=_offset(r, r.uniform(0.0, 0.8) * (fov - rad - 3 * px))).validate()
        if name == "core-wider-than-fov":  # the slice's corners are air, its sides cut the core
            return replace(base, radius_mm=r.uniform(1.12, 1.3) * half).validate()
        # block-turned: a square-ish prism turned in the slice plane
        a = r.uniform(0.45, 0.55) * half
        return replace(base, kind="block", half_sides_mm=(a, a * r.uniform(0.8, 1.0)),
                       angle_deg=r.uniform(15.0, 30.0) if rng is not None else 20.0,
                       centre_mm=_offset(r, 0.05 * half)).validate()

    @classmethod
    def random(cls, rng: np.random.Generator, shape: tuple[int, int, int],
               spacing_mm: tuple = (0.01, 0.01, 0.01)) -> "Scene":
        """Any set-up of :data:`SETUPS` with random sizes, some with a small tilt of the axis, some
        inside a circular field of view."""
        name = SETUPS[int(rng.integers(len(SETUPS)))]
        s = cls.setup(name, shape, spacing_mm, rng)
        if rng.random() < 0.3:
            s = replace(s, tilt=tuple(float(v) for v in rng.uniform(-0.03, 0.03, 2)))
        if name not in ("fov-circle", "core-wider-than-fov") and s.kind == "cylinder" and rng.random() < 0.25:
            half = min(shape[1] * s.spacing_mm[1], shape[2] * s.spacing_mm[2]) / 2.0
            reach = math.hypot(*s.container_centre_mm) + s.radius_mm + s.gap_mm + s.wall_mm
            if reach < 0.95 * half:
                s = replace(s, fov_radius_mm=float(rng.uniform(max(reach + 3 * s.spacing_mm[2], 0.9 * half), half)))
        return s.validate()


class _Middle:
    """Stands in for a generator: the middle of every range (the set-ups' fixed versions)."""

    def uniform(self, lo: float, hi: float, size=None):
        return 0.5 * (lo + hi) if size is None else np.full(size, 0.5 * (lo + hi))


def _offset(r, dist: float, fixed: bool = False) -> tuple[float, float]:
    """An (y, x) offset of length ``dist`` in a random direction (fixed: towards the upper left)."""
    a = math.radians(225.0) if fixed or isinstance(r, _Middle) else float(r.uniform(0.0, 2 * math.pi))
    return (float(dist * math.sin(a)), float(dist * math.cos(a)))


def _plane_coords(shape_yx: tuple[int, int], spacing: tuple, oversample: int) -> tuple[np.ndarray, np.ndarray]:
    """mm coordinates (y (n, 1), x (1, m)) of the fine grid's sub-pixel centres of a slice, from the
    slice centre."""
    ny, nx = shape_yx
    f = oversample
    y = ((np.arange(ny * f) + 0.5) / f - 0.5 - (ny - 1) / 2.0) * spacing[1]
    x = ((np.arange(nx * f) + 0.5) / f - 0.5 - (nx - 1) / 2.0) * spacing[2]
    return y[:, None], x[None, :]


def _inside(scene: Scene, y: np.ndarray, x: np.ndarray, z_mm: float) -> np.ndarray:
    """Bool: in the sample's geometry at height ``z_mm`` (from mid-height)."""
    cy = scene.centre_mm[0] + scene.tilt[0] * z_mm
    cx = scene.centre_mm[1] + scene.tilt[1] * z_mm
    dy, dx = y - cy, x - cx
    if scene.kind == "cylinder":
        # distance from the (tilted) axis: |d|^2 - (d . a)^2 with a the axis' unit direction
        n2 = 1.0 + scene.tilt[0] ** 2 + scene.tilt[1] ** 2
        along = (scene.tilt[0] * dy + scene.tilt[1] * dx)
        return dy * dy + dx * dx - along * along / n2 <= scene.radius_mm ** 2
    a = math.radians(scene.angle_deg)
    u = dx * math.cos(a) + dy * math.sin(a)
    v = -dx * math.sin(a) + dy * math.cos(a)
    return (np.abs(u) <= scene.half_sides_mm[0]) & (np.abs(v) <= scene.half_sides_mm[1])


def _wall(scene: Scene, y: np.ndarray, x: np.ndarray, z_mm: float) -> np.ndarray:
    cy, cx = scene.container_centre_mm
    cy, cx = cy + scene.tilt[0] * z_mm, cx + scene.tilt[1] * z_mm
    r2 = (y - cy) ** 2 + (x - cx) ** 2
    r_in = scene.radius_mm + scene.gap_mm
    return (r2 >= r_in ** 2) & (r2 < (r_in + scene.wall_mm) ** 2)


def _z_mm(nz: int, spacing_z: float, oversample: int) -> np.ndarray:
    """Heights (mm, from mid-height) of the fine grid's sub-slices."""
    return ((np.arange(nz * oversample) + 0.5) / oversample - 0.5 - (nz - 1) / 2.0) * spacing_z


def true_sample(scene: Scene, shape: tuple[int, int, int]) -> np.ndarray:
    """Bool ``(Z, Y, X)``: the voxels whose centre lies inside the sample's geometry (all of them
    for ``kind="none"``), within the field of view."""
    nz, ny, nx = shape
    if scene.kind == "none":
        out = np.ones(shape, bool)
    else:
        y, x = _plane_coords((ny, nx), scene.spacing_mm, 1)
        zs = _z_mm(nz, scene.spacing_mm[0], 1)
        out = np.stack([_inside(scene, y, x, float(z)) for z in zs])
    if scene.fov_radius_mm > 0:
        out &= _fov(scene, (ny, nx))[None]
    return out


def _fov(scene: Scene, shape_yx: tuple[int, int]) -> np.ndarray:
    y, x = _plane_coords(shape_yx, scene.spacing_mm, 1)
    return y * y + x * x <= scene.fov_radius_mm ** 2


def scene_fractions(fine_pores: np.ndarray, oversample: int, scene: Scene):
    """What each voxel holds, from the fine grid: ``(pores, material, wall)``, float32 ``(Z, Y, X)``
    shares of the voxel that are pore inside the sample, sample (pore or solid) and container wall."""
    f = int(oversample)
    nzf, nyf, nxf = fine_pores.shape
    shape = (nzf // f, nyf // f, nxf // f)
    y, x = _plane_coords(shape[1:], scene.spacing_mm, f)
    zs = _z_mm(shape[0], scene.spacing_mm[0], f)
    pores = np.zeros(shape, np.float32)
    material = np.zeros(shape, np.float32)
    wall = np.zeros(shape, np.float32)
    norm = np.float32(1.0 / f ** 3)

    def down(a: np.ndarray) -> np.ndarray:  # (Y*f, X*f) -> (Y, X) sums
        return a.reshape(shape[1], f, shape[2], f).sum(axis=(1, 3), dtype=np.float32)

    for k, z in enumerate(zs):
        inside = _inside(scene, y, x, float(z))
        material[k // f] += down(inside)
        pores[k // f] += down(inside & fine_pores[k].astype(bool))
        if scene.wall_mm > 0:
            wall[k // f] += down(_wall(scene, y, x, float(z)))
    return pores * norm, material * norm, wall * norm


def fov_outside(scene: Scene, shape_yx: tuple[int, int]) -> Optional[np.ndarray]:
    """Bool ``(Y, X)``: beyond the circular field of view (None: no such field)."""
    if scene.fov_radius_mm <= 0:
        return None
    return ~_fov(scene, shape_yx)
