"""Absolute permeability and tortuosity of a cube of the pores, through the libraries the field uses.

Flow needs the whole pore space of what it solves on at once, so it is not streamed: it runs on one
cube of at most :data:`MAX_CUBE` voxels a side (by default :data:`DEFAULT_CUBE`), taken wholly
inside the sample (:func:`choose_cube`: centred on the sample's centroid, as large as asked or as
fits), and the record says which cube it was. Per axis of the cube (Z, Y, X):

- the **permeability**, as OpenPNM validates it against direct numerical simulation: PoreSpy's
  ``snow2`` pore network with three voxels of boundary pores on the two faces of that axis,
  pyramids-and-cuboids conduits, pores not joined to the rest trimmed, and OpenPNM's Stokes flow
  between the two faces (solved by scipy's direct solver, and checked: what enters leaves);
  ``K = Q mu L / (A dP)`` with ``L`` the cube's side and its boundary layers
  and ``A`` the face; in m² and darcy (1 D = 9.869233e-13 m²), in voxels² where the units are
  unknown;
- the **tortuosity**, PoreSpy's ``tortuosity_fd`` (a finite-difference diffusion on the voxels,
  ``tau = porosity x formation factor``; 1 for straight channels), solved by PyAMG as PoreSpy does,
  or by conjugate gradients where PyAMG does not converge.

Both are None along an axis no pore path crosses. Both libraries are the optional extra
``analysis`` (``pip install "ctpore[analysis]"``); :func:`check_flow` says so in one line before
any work is done, as it says when the voxels are not cubes (the network's sizes assume they are).
"""

from __future__ import annotations

import contextlib
import io
import math
import warnings
from typing import Any, Optional

import numpy as np

from ctpore.errors import InputError
from ctpore.progress import ProgressFn

__all__ = ["DARCY_M2", "DEFAULT_CUBE", "FLOW_BASE_GIB", "FLOW_BYTES_PER_VOXEL", "MAX_CUBE", "MIN_CUBE", "check_flow",
           "choose_cube", "flow_figures", "flow_gib", "flow_side"]

#: One darcy in m².
DARCY_M2 = 9.869233e-13
#: The side of the cube the flow runs on by default, in voxels (a representative elementary volume
#: of most rocks and soils at micro-CT resolution, and a few minutes' work on a laptop).
DEFAULT_CUBE = 200
#: The largest side taken: the network extraction holds the cube many times over in memory, and the
#: solve's time grows faster than its volume.
MAX_CUBE = 400
#: The smallest side worth a flow figure.
MIN_CUBE = 16
#: The flow's peak memory, as ``ctpore bench flow`` measures it (each case a process of its own,
#: docs/flow.json): the process with PoreSpy and OpenPNM loaded, and the network's and the solvers'
#: bytes per voxel of the cube, taken from the most demanding case (a bicontinuous medium of
#: porosity 0.42 at 200^3: 3.96 GiB).
FLOW_BASE_GIB = 0.45
FLOW_BYTES_PER_VOXEL = 480


def check_flow(cube: int, spacing_mm, units_known: bool) -> None:
    """Refuse, before any work, what the flow cannot do: a side outside [MIN_CUBE, MAX_CUBE], voxels
    that are not cubes, or the extra not installed."""
    if not MIN_CUBE <= int(cube) <= MAX_CUBE:
        raise InputError(f"--flow-cube {cube}: the flow runs on a cube of {MIN_CUBE} to {MAX_CUBE} voxels a side "
                         f"(the network holds it many times over in memory); take a sub-volume of at most "
                         f"{MAX_CUBE}^3, e.g. the default {DEFAULT_CUBE}^3 at the sample's centre")
    if units_known:
        s = [float(v) for v in spacing_mm]
        if max(s) - min(s) > 1e-3 * max(s):
            raise InputError(f"the flow needs cubic voxels; these are {s[0]:g} x {s[1]:g} x {s[2]:g} mm (z, y, x): "
                             f"resample the pores to one spacing, or leave out --flow")
    try:
        import openpnm  # noqa: F401
        import porespy  # noqa: F401
    except ImportError as e:
        raise InputError(f"the flow needs PoreSpy and OpenPNM ({e.name} is not installed): "
                         f"pip install \"ctpore[analysis]\"") from None


def flow_gib(side: int) -> float:
    """The flow's expected peak memory (GiB) on a cube of ``side`` voxels (:data:`FLOW_BYTES_PER_VOXEL`)."""
    return FLOW_BASE_GIB + FLOW_BYTES_PER_VOXEL * float(side) ** 3 / 2**30


def flow_side(memory_gb: Optional[float], side: Optional[int] = None) -> int:
    """The cube's side under a memory budget of ``memory_gb`` (the whole process, GiB; None: no
    bound): ``side`` when given and it fits (refused in one line when it does not, naming the side
    that fits and the budget it needs), else :data:`DEFAULT_CUBE` or the largest side that fits."""
    want = DEFAULT_CUBE if side is None else int(side)
    if memory_gb is None or flow_gib(want) <= memory_gb:
        return want
    room = (memory_gb - FLOW_BASE_GIB) * 2**30 / FLOW_BYTES_PER_VOXEL
    fit = int(math.floor(room ** (1.0 / 3.0))) if room > 0 else 0
    while fit > 0 and flow_gib(fit) > memory_gb:  # the cube root's rounding
        fit -= 1
    need = math.ceil(flow_gib(want) * 10) / 10
    if fit < MIN_CUBE:
        raise InputError(f"--memory-gb {memory_gb:g} leaves no room for the flow (its smallest cube, "
                         f"{MIN_CUBE}^3, needs about {flow_gib(MIN_CUBE):.1f} GB): give --memory-gb {need:g}, or "
                         "leave out --flow")
    if side is not None:
        raise InputError(f"--flow-cube {want} needs about {need:g} GB for the flow (its pore network and "
                         f"solver), above --memory-gb {memory_gb:g}: give --flow-cube {fit} or less, or "
                         f"--memory-gb {need:g}")
    return fit


def choose_cube(shape, sample: Any = None, side: int = DEFAULT_CUBE) -> tuple[tuple[int, int, int], int]:
    """``((z0, y0, x0), n)``: the cube of side ``n`` (at most ``side``) that the flow runs on, wholly
    inside ``sample`` (an array or a Scan, ``(Z, Y, X)``, nonzero in the sample; None: every voxel),
    centred on the sample's centroid and shrunk until no voxel of it lies outside the sample.
    Raises :class:`~ctpore.errors.InputError` when no cube of :data:`MIN_CUBE` fits."""
    shape = tuple(int(s) for s in shape)
    n = min(int(side), *shape)
    if sample is None:
        centre = [s / 2.0 for s in shape]
        inside = None
    else:  # the centroid and, slice by slice, the sample (streamed: one slice at a time)
        tot, acc = 0, np.zeros(3)
        for z in range(shape[0]):
            m = np.asarray(sample[z:z + 1])[0] != 0
            k = int(np.count_nonzero(m))
            if k:
                yy, xx = np.nonzero(m)
                acc += (z * k, float(yy.sum()), float(xx.sum()))
                tot += k
        if not tot:
            raise InputError("the sample mask holds no voxel: no cube to run the flow on")
        centre = list(acc / tot + 0.5)
        inside = sample
    while n >= MIN_CUBE:
        start = tuple(int(min(max(round(c - n / 2.0), 0), s - n)) for c, s in zip(centre, shape))
        if inside is None or _all_inside(inside, start, n):
            return start, n
        n = int(n * 0.9)
    raise InputError(f"no cube of {MIN_CUBE} voxels a side lies wholly inside the sample about its centre: "
                     f"the flow needs a solid block of sample; give --sample a mask of it, or leave out --flow")


def _all_inside(sample, start, n) -> bool:
    z0, y0, x0 = start
    for z in range(z0, z0 + n):
        if not np.all(np.asarray(sample[z:z + 1])[0, y0:y0 + n, x0:x0 + n]):
            return False
    return True


@contextlib.contextmanager
def _quiet():
    """PoreSpy's and OpenPNM's progress bars and log lines off for the call (ctpore draws its own)."""
    import logging

    loggers = [logging.getLogger(name) for name in ("openpnm", "porespy")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


def _permeability(im: np.ndarray, axis: int, voxel_m: float) -> Optional[float]:
    """Permeability along ``axis`` (m², or voxels² with ``voxel_m`` 1), OpenPNM's validated recipe."""
    import openpnm as op
    import porespy as ps

    width = [0, 0, 0]
    width[axis] = 3
    snow = ps.networks.snow2(im, voxel_size=voxel_m, boundary_width=width, accuracy="standard")
    pn = op.io.network_from_porespy(snow.network)
    side = "xyz"[axis]  # PoreSpy names the array's axes 0, 1, 2 x, y, z
    if pn.Np == 0 or not len(pn.pores(f"{side}min")) or not len(pn.pores(f"{side}max")):
        return None
    pn["pore.diameter"] = pn["pore.equivalent_diameter"]
    pn["throat.diameter"] = pn["throat.inscribed_diameter"]
    pn["throat.spacing"] = pn["throat.total_length"]
    pn.add_model(propname="throat.hydraulic_size_factors",
                 model=op.models.geometry.hydraulic_size_factors.pyramids_and_cuboids)
    pn.regenerate_models()
    health = op.utils.check_network_health(pn)
    op.topotools.trim(network=pn, pores=health["disconnected_pores"])
    inlet, outlet = pn.pores(f"{side}min"), pn.pores(f"{side}max")
    if not len(inlet) or not len(outlet):  # no path from face to face
        return None
    fluid = op.phase.Phase(network=pn)
    fluid["pore.viscosity"] = 1.0
    fluid.add_model(propname="throat.hydraulic_conductance",
                    model=op.models.physics.hydraulic_conductance.generic_hydraulic)
    fluid.regenerate_models()
    flow = op.algorithms.StokesFlow(network=pn, phase=fluid)
    flow.set_value_BC(pores=inlet, values=1.0)
    flow.set_value_BC(pores=outlet, values=0.0)
    # scipy's direct solver: OpenPNM's default where pypardiso is installed (MKL's PARDISO) returned
    # pressures that miss their own boundary values on an AMD EPYC here, without an error
    flow.run(solver=op.solvers.ScipySpsolve())
    q = float(flow.rate(pores=inlet, mode="group")[0])
    q_out = float(flow.rate(pores=outlet, mode="group")[0])
    if not (math.isfinite(q) and q > 0 and abs(q + q_out) <= 1e-6 * q):  # what enters leaves
        raise RuntimeError(f"the Stokes flow along axis {axis} did not conserve mass (in {q:.4g}, out {-q_out:.4g})")
    n = im.shape
    length = (n[axis] + 6) * voxel_m
    area = float(np.prod([n[a] for a in range(3) if a != axis])) * voxel_m ** 2
    return q * length / area  # mu = 1, dP = 1


def _tortuosity(im: np.ndarray, axis: int) -> Optional[float]:
    import porespy as ps

    try:
        res = ps.simulations.tortuosity_fd(im, axis=axis)
    except Exception as e:
        if "converge" not in str(e).lower():
            raise
        # PyAMG, PoreSpy's default, gave up on a poorly joined pore space (vesicles behind narrow
        # throats, 200^3, here): scipy's conjugate gradients to a residual of 1e-8 instead
        import openpnm as op

        res = ps.simulations.tortuosity_fd(im, axis=axis, solver=op.solvers.ScipyCG(tol=1e-8))
    tau = float(res.tortuosity)
    return tau if math.isfinite(tau) and tau > 0 else None


def flow_figures(pores: np.ndarray, voxel_mm: Optional[float], progress: ProgressFn = None) -> dict:
    """Per axis (Z, Y, X) of the cube ``pores`` (bool, the cube wholly inside the sample):
    ``permeability_zyx`` (m², or voxels² where ``voxel_mm`` is None), ``permeability_darcy_zyx`` (None
    where the units are unknown) and ``tortuosity_zyx``; None along an axis no pore path crosses."""
    im = np.ascontiguousarray(np.asarray(pores, bool))
    if im.ndim != 3 or len(set(im.shape)) != 1:
        raise ValueError(f"the flow runs on a cube, got {im.shape}")
    voxel_m = voxel_mm * 1e-3 if voxel_mm is not None else 1.0
    perm, tort = [], []
    with _quiet():
        import porespy as ps

        ps.settings.tqdm["disable"] = True
        from scipy import ndimage as ndi

        lab = ndi.label(im)[0]  # 6-connected pore paths: what a diffusion or a flow through the voxels needs
        for axis in range(3):
            if progress is not None:
                progress(axis, 3, "flow")
            crosses = _crosses(lab, axis)
            perm.append(_permeability(im, axis, voxel_m) if crosses else None)
            tort.append(_tortuosity(im, axis) if crosses else None)
    if progress is not None:
        progress(3, 3, "flow")
    darcy = [None if k is None or voxel_mm is None else k / DARCY_M2 for k in perm]
    return {"permeability_zyx": perm, "permeability_darcy_zyx": darcy, "tortuosity_zyx": tort}


def _crosses(lab: np.ndarray, axis: int) -> bool:
    """Whether a component of ``lab`` (the cube's 6-connected pore components) joins the cube's two
    faces along ``axis``."""
    a = np.unique(np.take(lab, 0, axis=axis))
    b = np.unique(np.take(lab, -1, axis=axis))
    return bool(np.intersect1d(a[a > 0], b[b > 0]).size)
