"""``ctpore bench analysis``: ``ctpore analyze`` beside PoreSpy, scikit-image and the analytic truth.

- **Pore sizes**: on the real Leopard sandstone (the repository's test copy) and on a simulated
  volume of each pore family, the local thickness of ``ctpore analyze`` against PoreSpy 3.2's
  ``local_thickness(method="dt")`` (run in a child process, where PoreSpy is installed): the two
  maps voxel for voxel, and d10, d50 and d90 (the same volume-weighted rule on both maps) against
  the tolerance of one radius step (2 voxels of diameter) or 10%, whichever is larger.
- **Drainage**: the drainage curve from the top face against PoreSpy 3.2's ``porosimetry(method="dt")``
  with the same inlet: the curves (the pore volume invaded at each diameter) equal or not, and d50.
- **Connectivity**: the connected and percolating porosities and the verdicts against a
  whole-volume labelling (``skimage.measure.label``, 26-connected).
- **Surface area**: against the analytic area of balls and of planes at random orientations, with
  marching cubes' area (scikit-image) beside it for reference.
- **Scale**: whole processes on simulated volumes (``ctpore analyze`` with its default memory
  budget; PoreSpy's ``local_thickness`` where it finishes within the time limit): seconds and peak
  memory (the child's peak resident set).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

from ctpore.data.splits import FURTHER_SEED_BASE
from ctpore.progress import ProgressFn

__all__ = ["ANALYSIS_SEED_BASE", "bench_analysis", "cpu_name", "drainage_matches", "map_drainage_d50",
           "plane_area_in_box", "quantiles_match", "run_child"]

#: Seeds of the simulated volumes (the further held-out block, apart from the sample and adapt benches').
ANALYSIS_SEED_BASE = FURTHER_SEED_BASE + 800_000

_PORESPY_CHILD = r"""
import json, sys, time, resource
import numpy as np
t0 = time.perf_counter()
import porespy as ps
im = np.load(sys.argv[1]).astype(bool)
lt = ps.filters.local_thickness(im, method="dt")
np.save(sys.argv[2], lt.astype(np.int16))
print(json.dumps({"seconds": time.perf_counter() - t0, "version": ps.__version__}))
"""


_PORESPY_DRAINAGE = r"""
import json, sys, time
import numpy as np
t0 = time.perf_counter()
import porespy as ps
im = np.load(sys.argv[1]).astype(bool)
inlets = np.zeros_like(im)
inlets[int(sys.argv[3])] = True
r = ps.filters.porosimetry(im, inlets=inlets, method="dt", smooth=True)
np.save(sys.argv[2], r.astype(np.float64))
print(json.dumps({"seconds": time.perf_counter() - t0, "version": ps.__version__}))
"""


def drainage_matches(curve: dict, radii: np.ndarray, n_pore: int, unit: float) -> bool:
    """A drainage curve against a map of drainage radii (PoreSpy's, or one written out; 0: never
    invaded; ``n_pore`` pore voxels): every radius of the map is a step of the curve, and at each step
    the share invaded is that of the map's voxels at that radius or more."""
    steps = 0.5 * np.asarray(curve["diameter"], np.float64) / unit
    seen = np.unique(radii[radii > 0])
    hit = all(np.isclose(steps, r, rtol=1e-6).any() for r in seen)
    shares = [np.count_nonzero(radii >= r * (1 - 1e-6)) / n_pore for r in steps]
    return bool(hit and np.allclose(curve["invaded"], shares, rtol=1e-12, atol=0.0))


def map_drainage_d50(radii: np.ndarray, n_pore: int, unit: float) -> Optional[float]:
    """The diameter at which half the pore volume is invaded, from a map of drainage radii (None where
    it never is)."""
    for r in np.unique(radii[radii > 0])[::-1]:
        if np.count_nonzero(radii >= r) >= 0.5 * n_pore - 1e-9:
            return float(2 * r * unit)
    return None


def quantiles_match(a: Optional[float], b: Optional[float], step: float) -> bool:
    """Within one radius step (2 voxels of diameter, ``step`` in the same unit) or 10%, the larger."""
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= max(step, 0.1 * abs(b))


_WRAPPER = r"""
import resource, subprocess, sys
rc = subprocess.run(sys.argv[2:]).returncode
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(rc)
"""


def run_child(args: list, timeout: float, env: Optional[dict] = None) -> dict:
    """Run a child process under a wrapper of its own (so that its peak resident set is its alone):
    wall seconds, peak GB, exit code and the last line of its output."""
    import tempfile

    fd, peak_file = tempfile.mkstemp(suffix=".maxrss")
    os.close(fd)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", _WRAPPER, peak_file, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        os.unlink(peak_file)
        return {"seconds": round(time.perf_counter() - t0, 1), "peak_gb": None, "rc": None, "timed_out": True}
    seconds = round(time.perf_counter() - t0, 1)
    try:
        peak = round(int(Path(peak_file).read_text() or 0) / 2**20, 3)  # kB on Linux
    except (OSError, ValueError):
        peak = None
    os.unlink(peak_file)
    last = out.strip().splitlines()[-1] if out.strip() else ""
    return {"seconds": seconds, "peak_gb": peak, "rc": proc.returncode, "timed_out": False, "out": last,
            "err": err.strip().splitlines()[-1] if proc.returncode and err.strip() else ""}


def _porespy_python(given: Optional[str]) -> Optional[str]:
    cands = [given] if given else [sys.executable]
    for py in cands:
        try:
            r = subprocess.run([py, "-c", "import porespy"], capture_output=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            return py
    return None


def _label(volume: np.ndarray) -> tuple:
    from skimage.measure import label

    return label(volume.astype(bool), connectivity=3, return_num=True)


def _connectivity_reference(pores: np.ndarray) -> dict:
    """Connected porosity (touching a face of the volume) and percolation along z, y, x from a
    whole-volume labelling, with every voxel the sample."""
    lab, _n = _label(pores)
    n = pores.size
    faces = [np.unique(np.concatenate([np.take(lab, 0, axis=a).ravel(), np.take(lab, -1, axis=a).ravel()]))
             for a in range(3)]
    touching = np.setdiff1d(np.unique(np.concatenate(faces)), [0])
    perc = []
    for a in range(3):
        both = np.intersect1d(np.unique(np.take(lab, 0, axis=a)), np.unique(np.take(lab, -1, axis=a)))
        perc.append(float(np.isin(lab, both[both > 0]).sum() / n))
    return {"connected_porosity": float(np.isin(lab, touching).sum() / n), "percolating_porosity_zyx": perc,
            "percolates_zyx": [p > 0 for p in perc]}


def _pore_sizes(radii: np.ndarray, unit: float) -> dict:
    from ctpore.pipelines.analysis import thickness_summary

    return thickness_summary(np.bincount(radii.ravel().astype(np.int64)), unit)


def _case(name: str, pores: np.ndarray, spacing: tuple, porespy: Optional[str], workdir: Path) -> dict:
    from ctpore.data.io.geometry import geometry_from_array
    from ctpore.pipelines.analysis import SlabsInMemory, analyze_volume

    geom = geometry_from_array(pores.shape, spacing)
    thickness = SlabsInMemory()
    got = analyze_volume(pores, geom, thickness_writer=thickness)
    unit = min(spacing)
    if name == "leopard":  # the report's picture: the real sandstone's pore-size distribution
        from ctpore.pipelines.analysis_outputs import write_psd_png

        write_psd_png(got["psd_counts"], unit, "mm", workdir / "leopard_psd.png", got)
    row = {"name": name, "shape": list(pores.shape), "spacing_mm": list(spacing), "porosity": got["porosity"],
           "ctpore": {k: got[k] for k in ("thickness_d10", "thickness_d50", "thickness_d90", "thickness_mean",
                                          "connected_porosity", "percolating_porosity_zyx", "percolates_zyx",
                                          "surface_area", "specific_surface", "drainage_d50")}}
    ref = _connectivity_reference(pores)
    row["labelling"] = ref
    row["connectivity_equal"] = (abs(ref["connected_porosity"] - got["connected_porosity"]) < 1e-12
                                 and ref["percolates_zyx"] == got["percolates_zyx"]
                                 and all(abs(a - b) < 1e-12 for a, b in zip(ref["percolating_porosity_zyx"],
                                                                              got["percolating_porosity_zyx"])))
    if porespy is not None:
        src, dst = workdir / f"{name}.npy", workdir / f"{name}_lt.npy"
        np.save(src, pores.astype(np.uint8))
        run = run_child([porespy, "-c", _PORESPY_CHILD, str(src), str(dst)], timeout=3600)
        if run["rc"] == 0:
            ps_radii = np.load(dst)
            ps = _pore_sizes(ps_radii, unit)
            row["porespy"] = {**{f"thickness_{k}": v for k, v in ps.items()},
                              "version": json.loads(run["out"])["version"]}
            # the map analyze wrote (diameters, 2 r unit) against PoreSpy's radii in the same units
            row["maps_equal_voxels"] = float(np.mean(thickness.volume() == (2.0 * ps_radii * unit).astype(np.float32)))
            row["quantiles_match"] = all(quantiles_match(got[f"thickness_{q}"], ps[q], 2 * unit)
                                         for q in ("d10", "d50", "d90"))
        else:
            row["porespy"] = {"error": run.get("err") or "timed out"}
        if got["drainage"] is not None and run["rc"] == 0:  # the drainage curve from the top face
            inlet = got["drainage"]["inlet_slice"]
            dst = workdir / f"{name}_drainage.npy"
            drun = run_child([porespy, "-c", _PORESPY_DRAINAGE, str(src), str(dst), str(inlet)], timeout=3600)
            if drun["rc"] == 0:
                theirs = np.load(dst)
                row["porespy"]["drainage_d50"] = map_drainage_d50(theirs, int(pores.sum()), unit)
                row["drainage_equal"] = drainage_matches(got["drainage"], theirs, int(pores.sum()), unit)
    return row


def _marching_cubes_area(vol: np.ndarray) -> float:
    from skimage.measure import marching_cubes, mesh_surface_area

    padded = np.pad(vol.astype(np.float32), 1)
    verts, faces, _n, _v = marching_cubes(padded, 0.5)
    return float(mesh_surface_area(verts, faces))


def _surface_cases(seed: int = 0) -> list:
    from ctpore.data.minkowski import minkowski_measures

    rows = []
    for r in (10.0, 20.0, 30.0):
        n = int(2 * r + 8)
        z, y, x = np.indices((n, n, n)) - (n - 1) / 2 - 0.23
        ball = (z * z + y * y + x * x < r * r).astype(np.uint8)
        exact = 4 * math.pi * r * r
        rows.append({"shape": f"ball r={r:g}", "analytic": exact, "ctpore": minkowski_measures(ball)["surface_area"],
                     "marching_cubes": _marching_cubes_area(ball)})
    rng = np.random.default_rng(seed)
    size = 64
    idx = np.indices((size, size, size)).reshape(3, -1).T
    for k in range(8):
        normal = rng.normal(size=3)
        normal /= np.linalg.norm(normal)
        c = float(normal @ np.full(3, (size - 1) / 2))
        half = (idx @ normal < c).reshape(size, size, size).astype(np.uint8)
        # the tiles' region [0, size-1]^3: the plane's area in it (a convex polygon)
        rows.append({"shape": f"plane {k + 1} (normal {', '.join(f'{v:+.2f}' for v in normal)})",
                     "analytic": plane_area_in_box(normal, c, size), "ctpore": minkowski_measures(half)["surface_area"],
                     "marching_cubes": None})
    for r in rows:
        r["ctpore_error"] = r["ctpore"] / r["analytic"] - 1
        r["marching_cubes_error"] = None if r["marching_cubes"] is None else r["marching_cubes"] / r["analytic"] - 1
    return rows


def plane_area_in_box(normal: np.ndarray, c: float, size: int) -> float:
    """The area of the plane ``normal . p = c`` inside the box ``[0, size - 1]^3`` (the region of a
    ``size^3`` volume's tiles): a convex polygon, from its corners on the box's edges."""
    import itertools

    pts = []
    for a in range(3):
        o = [i for i in range(3) if i != a]
        if abs(normal[a]) < 1e-12:
            continue
        for u, v in itertools.product((0, size - 1), repeat=2):
            p = np.zeros(3)
            p[o[0]], p[o[1]] = u, v
            p[a] = (c - normal[o[0]] * u - normal[o[1]] * v) / normal[a]
            if 0 <= p[a] <= size - 1:
                pts.append(p)
    pts = np.array(pts)
    centre = pts.mean(axis=0)
    e1 = (pts[0] - centre) / np.linalg.norm(pts[0] - centre)
    e2 = np.cross(normal, e1)
    q = pts[np.argsort(np.arctan2((pts - centre) @ e2, (pts - centre) @ e1))]
    return float(0.5 * np.linalg.norm(sum(np.cross(q[i], q[(i + 1) % len(q)]) for i in range(len(q)))))


def _scale(sizes: tuple, porespy: Optional[str], workdir: Path, limit_s: float, porespy_max: int,
           progress: ProgressFn) -> list:
    """Whole processes on grain packings of each size: one simulated 256³ packing, tiled to sizes
    that are multiples of 256 (written slab by slab, never held whole), else simulated at the size."""
    from ctpore.data.io.geometry import geometry_from_array
    from ctpore.data.io.write import SlabWriter
    from ctpore.data.synthetic import make_pair

    base = None
    rows = []
    for n in sizes:
        path = workdir / f"scale_{n}_pores.nii.gz"
        if n % 256 == 0:
            if base is None:
                _s, base, _m = make_pair(ANALYSIS_SEED_BASE + 100, shape=(256, 256, 256), family="grains")
            k = n // 256
            with SlabWriter(path, geometry_from_array((n, n, n), (0.01, 0.01, 0.01)), np.uint8) as w:
                for z in range(0, n, 64):
                    w.write(np.tile(base[z % 256:z % 256 + 64], (1, k, k)))
        else:
            import nibabel as nib

            _s, small, _m = make_pair(ANALYSIS_SEED_BASE + 100 + n, shape=(n, n, n), family="grains")
            img = nib.Nifti1Image(np.ascontiguousarray(small.T), np.diag([0.01, 0.01, 0.01, 1.0]))
            img.header.set_xyzt_units("mm")
            nib.save(img, path)
        env = {**os.environ, "CTPORE_NO_PROGRESS": "1"}
        mine = run_child([sys.executable, "-m", "ctpore.app.cli", "analyze", str(path), "-o", str(workdir / f"out_{n}"),
                       "--overwrite", "--json"], timeout=limit_s * 8, env=env)
        row = {"size": n, "voxels": n**3, "ctpore": {k: mine[k] for k in ("seconds", "peak_gb", "rc")}}
        if porespy is not None and n <= porespy_max:
            import nibabel as nib

            np.save(workdir / f"scale_{n}.npy", np.asarray(nib.load(path).dataobj).T.astype(np.uint8))
            ps = run_child([porespy, "-c", _PORESPY_CHILD, str(workdir / f"scale_{n}.npy"),
                         str(workdir / f"scale_{n}_lt.npy")], timeout=limit_s)
            row["porespy"] = {k: ps.get(k) for k in ("seconds", "peak_gb", "rc", "timed_out")}
        elif porespy is not None:
            row["porespy"] = {"skipped": f"not run above {porespy_max}³ (it holds the volume and its maps whole)"}
        rows.append(row)
        if progress is not None:
            progress(len(rows), len(sizes), f"scale {n}^3")
    return rows


def bench_analysis(sizes: tuple = (256, 512, 1024), sim_size: int = 128, porespy_python: Optional[str] = None,
                   workdir: Path = Path("runs/analysis"), limit_s: float = 1800.0, porespy_max: int = 512,
                   progress: ProgressFn = None) -> dict:
    """Every comparison of the module docstring; returns the report's content."""
    from ctpore.data.synthetic import make_pair
    from ctpore.data.synthetic.structures import FAMILIES
    from ctpore.pipelines.bench.quality import default_leopard

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    porespy = _porespy_python(porespy_python)
    cases = []
    leo = default_leopard()
    if leo is not None:
        from ctpore.data.io import read_volume

        vol, geom = read_volume(leo)
        cases.append(_case("leopard", (vol > 0).astype(np.uint8), geom.spacing_mm, porespy, workdir))
    for i, fam in enumerate(FAMILIES):
        _s, pores, _m = make_pair(ANALYSIS_SEED_BASE + i, shape=(sim_size,) * 3, family=fam)
        cases.append(_case(fam, pores, (0.01, 0.01, 0.01), porespy, workdir))
        if progress is not None:
            progress(i + 1, len(FAMILIES), f"pore sizes: {fam}")
    return {"porespy": porespy is not None, "cases": cases, "surface": _surface_cases(), "workdir": str(workdir),
            "scale": _scale(tuple(sizes), porespy, workdir, limit_s, porespy_max, progress), "sim_size": sim_size,
            "cpu": cpu_name()}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f", {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{os.cpu_count()} cores"
