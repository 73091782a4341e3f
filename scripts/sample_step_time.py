"""Time the sample step (``prepare_sample``, the step that finds which voxels are the sample) on a
large simulated core, off the slice centre, 256 x 1024 x 1024 uint16 (NIfTI, uncompressed, so that
the time is the step's own work and not gzip's): dry in air, with brine-filled pores in air, or with
the constant 0 beyond its surface.

``python scripts/sample_step_time.py OUT.json [--kind dry|brine|zero] [--repeats N] [--append]`` makes
the core once
(``runs/big/core_256x1024.nii`` by default), then runs the step ``N`` times and writes the median
seconds with the CPU's name. Run it with two versions of ctpore importable in turn (e.g. an older
checkout on PYTHONPATH) to compare them on one machine, interleaved. The step is what the
reconstruct pipeline counts as its ``sample`` stage: the sample found and its mask written
(``prepare_sample``), then the scan copied with its outside filled for the methods (``--append``: one run at a time
into the same file, alternating the versions).
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


#: The cores: a dry core in air (its pores as dark as the air), one with brine-filled pores (the air
#: darker than they are), one with the constant 0 beyond its surface (a field of view cut to it).
CORES = ("dry", "brine", "zero")


def make_core(path: Path, shape=(256, 1024, 1024), seed: int = 7, kind: str = "dry") -> None:
    """A core of radius 400 voxels off the slice centre: a bicontinuous structure (a smoothed random
    field cut at 30% porosity), rendered by the scanner model slab by slab, in air (``dry``, ``brine``)
    or with 0 beyond its surface (``zero``)."""
    import nibabel as nib

    from ctpore.data.synthetic.fields import smooth_field, quantile_value
    from ctpore.data.synthetic.scanner import ScannerParams, _render
    from ctpore.data.synthetic.scenes import Scene, scene_fractions

    nz, ny, nx = shape
    scene = Scene(kind="cylinder", spacing_mm=(0.01, 0.01, 0.01), centre_mm=(-0.6, 0.5), radius_mm=4.0)
    params = ScannerParams.realistic()
    params.cnr, params.ring_count = 8.0, 0
    out = np.zeros(shape, np.uint16)
    rng = np.random.default_rng(seed)
    for z0 in range(0, nz, 32):
        field = smooth_field(rng, (32, ny, nx), 3.0)
        pores = field < quantile_value(field[:, ::8, ::8], 0.3)
        # the slab's heights, as a scene of the whole stack sees them
        sub = Scene(**{**scene.__dict__, "centre_mm": scene.centre_mm})
        p, m, w = scene_fractions(pores, 1, sub)
        out[z0:z0 + 32] = _render(p, rng, params, (m, w, 0.5 if kind == "brine" else 0.0))
        if kind == "zero":
            out[z0:z0 + 32][m < 0.5] = 0
    img = nib.Nifti1Image(np.ascontiguousarray(out.T), np.diag([0.01, 0.01, 0.01, 1.0]))
    img.header.set_xyzt_units("mm")
    nib.save(img, str(path))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--kind", default="dry", choices=CORES)
    ap.add_argument("--core", default=None, help="default: runs/big/core_KIND_256x1024.nii")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--append", action="store_true", help="add these runs' seconds to those already in OUT")
    a = ap.parse_args()
    core = Path(a.core or f"runs/big/core_{a.kind}_256x1024.nii")
    if not core.exists():
        core.parent.mkdir(parents=True, exist_ok=True)
        make_core(core, kind=a.kind)
    import ctpore
    from ctpore.data.io import load_scan
    from ctpore.pipelines.sample_mask import prepare_sample

    times = []
    found = None
    for _ in range(a.repeats):
        with load_scan(core) as scan, tempfile.TemporaryDirectory(dir=core.parent) as tmp:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t0 = time.perf_counter()
                kw = {"copy_filled": True} if "copy_filled" in inspect.signature(prepare_sample).parameters else {}
                mask = prepare_sample(scan, scan.geometry, "auto", Path(tmp), **kw)  # as the pipeline calls it
                with mask.filled(scan, Path(tmp)):  # the outside filled for the methods: the rest of the step
                    pass
                times.append(time.perf_counter() - t0)
            found = {k: v for k, v in mask.info.items() if isinstance(v, (str, int, float))}
            mask.close()
    if a.append and Path(a.out).exists():
        times = json.loads(Path(a.out).read_text())["seconds"] + times
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    flags = open("/proc/cpuinfo").read()
    res = {"ctpore": tree_commit(Path(ctpore.__file__).parent), "core": a.kind, "shape_zyx": [256, 1024, 1024],
           "seconds": times,
           "median_seconds": statistics.median(times), "cpu": cpu, "avx512_bf16": "avx512_bf16" in flags,
           "machine": platform.machine(), "found": found}
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res))


def tree_commit(folder: Path) -> str:
    """The git commit of the checkout the code came from (a path on this machine means nothing elsewhere)."""
    import subprocess

    out = subprocess.run(["git", "-C", str(folder.resolve()), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True)
    return f"commit {out.stdout.strip()}" if out.returncode == 0 else "not a git checkout"


if __name__ == "__main__":
    main()
