"""``ctpore bench split``: what splitting one scan across workers costs, and a model of the wall time
of large scans on N nodes, from measurements on this machine (``docs/scale.md``).

One simulated core in air (an outside, so the sample's codes are part of every slab's work) is
reconstructed three ways, each in a process of its own: in one process, and split across a local
Dask cluster of 1 and of 2 workers. Each process reports its wall time and its CPU seconds with
those of its children (a local cluster's workers are its children, counted once the cluster is
closed). The split's extra work is the CPU of the warm-up slices (each slab's CPU times the share of
its computed slices that were warm-up) and the driver's CPU while it joins the slabs; the report
gives it as a share of the single run's CPU seconds, beside the whole processes' ratio (which also
counts each worker's start: its imports and its copy of the model).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from ctpore.atomic import write_json_atomic, write_lines_atomic
from ctpore.progress import ProgressFn

__all__ = ["bench_split", "gpu_rates", "scale_model", "write_scale_report"]

#: The scans the model's table gives (Z = Y = X).
MODEL_SIDES = (2048, 4096)
#: Nodes the model's table gives.
MODEL_NODES = (1, 4, 16, 64)

_SINGLE = """
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
from ctpore.runtime import quiet_openmp, tune_allocator
tune_allocator(); quiet_openmp()  # as the ctpore command does
from ctpore.pipelines.reconstruct import reconstruct_file
t = time.perf_counter()
r = reconstruct_file({scan!r}, {out!r}, output_format="ome-zarr", overwrite=True)
wall = time.perf_counter() - t
"""

_SPLIT = """
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
from ctpore.runtime import quiet_openmp, tune_allocator
tune_allocator(); quiet_openmp()  # as the ctpore command does (the workers tune their allocator)
from ctpore.pipelines.batch_cluster import start_cluster
from ctpore.pipelines.split import reconstruct_split
client, cluster, _ = start_cluster(None, {workers}, 1, retries=3)
t = time.perf_counter()
r = reconstruct_split({scan!r}, {out!r}, client, overwrite=True, slab_slices={slab})
wall = time.perf_counter() - t
client.close(); cluster.close()
"""


#: The end of both timed scripts: the wall and CPU seconds and the metrics, as JSON into the file
#: named by the script's first argument (the parent reads it; stdout is the run's own).
_REPORT = """
ru = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
with open(sys.argv[1], "w") as fh:
    json.dump({"wall": wall, "cpu": sum(u.ru_utime + u.ru_stime for u in ru), "metrics": r["result"]}, fh)
"""


def _run(code: str) -> dict:
    """Run one timed script (:data:`_SINGLE` or :data:`_SPLIT`, filled in) in its own process; its report."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "result.json"
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code) + _REPORT, str(report)],
                              capture_output=True, text=True, env={**os.environ, "CTPORE_NO_PROGRESS": "1"})
        if proc.returncode == 0 and report.is_file():
            return json.loads(report.read_text())
    raise RuntimeError(f"the timed run failed:\n{proc.stderr[-3000:]}")


def _same_voxels(a: Path, b: Path) -> bool:
    import zarr

    for kind in ("pores", "prob", "sample"):
        pa, pb = next(a.glob(f"*_{kind}.ome.zarr"), None), next(b.glob(f"*_{kind}.ome.zarr"), None)
        if (pa is None) != (pb is None):
            return False
        if pa is not None and not np.array_equal(zarr.open_group(str(pa), mode="r")["0"][:],
                                                 zarr.open_group(str(pb), mode="r")["0"][:]):
            return False
    return True


def bench_split(shape: Sequence[int] = (896, 256, 256), workers: Sequence[int] = (1, 2),
                slab_slices: Optional[int] = None, workdir: Union[str, os.PathLike] = "runs/split",
                progress: ProgressFn = None) -> dict:
    """Run the benchmark (see the module docstring); returns its figures."""
    from ctpore.data.io import geometry_from_array, save_volume
    from ctpore.data.synthetic import make_pair
    from ctpore.models.weights import load_for_inference
    from ctpore.pipelines.split import STORE_ALIGN
    from ctpore.pipelines.stream_plan import warm_up

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    shape = tuple(int(s) for s in shape)
    scan = workdir / f"core_{'x'.join(map(str, shape))}.nii"
    if not scan.exists():
        vol, _truth, info = make_pair(3, shape=shape, scene="core-air-offcentre")
        save_volume(scan, np.asarray(vol), geometry_from_array(shape, tuple(info["scene"]["spacing_mm"])))
    reach = warm_up(load_for_inference(None, "cpu", None)[0], "cpu")
    slab = slab_slices or 8 * reach
    steps = 1 + len(workers)
    single = _run(_SINGLE.format(scan=str(scan), out=str(workdir / "one")))
    if progress is not None:
        progress(1, steps, "bench split")
    runs = {}
    for i, n in enumerate(workers):
        out = workdir / f"split{n}"
        r = _run(_SPLIT.format(workers=int(n), scan=str(scan), out=str(out), slab=int(slab)))
        s = r["metrics"]["split"]
        computed = [L + w for L, w in zip(_own_slices(shape[0], s), _warm_ups(s))]
        halo_cpu = sum(c * w / max(t, 1) for c, w, t in zip(s["slab_cpu_seconds"], _warm_ups(s), computed))
        runs[n] = {"wall_s": round(r["wall"], 2), "cpu_s": round(r["cpu"], 2),
                   "stage_seconds": r["metrics"]["stage_seconds"],
                   "slabs": s["slabs"], "slab_slices": s["slab_slices"], "warm_up_slices": s["warm_up_slices"],
                   "slab_warm_up_slices": s["slab_warm_up_slices"],
                   "slab_seconds": s["slab_seconds"], "slab_cpu_seconds": s["slab_cpu_seconds"],
                   "halo_cpu_s": round(halo_cpu, 2), "join_cpu_s": s["join_cpu_seconds"],
                   "extra_share": round((halo_cpu + s["join_cpu_seconds"]) / single["cpu"], 4),
                   "whole_cpu_ratio": round(r["cpu"] / single["cpu"], 3),
                   "speedup": round(single["wall"] / r["wall"], 3),
                   "same_voxels": _same_voxels(workdir / "one", out),
                   "same_metrics": _metrics_equal(single["metrics"], r["metrics"])}
        if progress is not None:
            progress(2 + i, steps, "bench split")
    nifti = _nifti_rate(workdir / f"split{workers[-1]}", workdir / "nifti")
    return {"nifti": nifti, "shape_zyx": list(shape), "reach_slices": reach, "slab_slices_asked": slab,
            "store_align": STORE_ALIGN,
            "cpu": _cpu_name(), "single": {"wall_s": round(single["wall"], 2), "cpu_s": round(single["cpu"], 2),
                                           "stage_seconds": single["metrics"]["stage_seconds"]},
            "split": {str(k): v for k, v in runs.items()}}


def _nifti_rate(stores: Path, out: Path) -> dict:
    """What streaming the stores into NIfTI costs on the driver (``--output-format nifti``): seconds
    per voxel of the pores, probability and sample together, timed here."""
    import time

    from ctpore.data.io import load_scan
    from ctpore.pipelines.split import store_to_nifti

    out.mkdir(parents=True, exist_ok=True)
    seconds, voxels = 0.0, 0
    for store in sorted(stores.glob("*.ome.zarr")):
        with load_scan(store) as scan:
            geometry, dtype = scan.geometry, scan.dtype
        t = time.perf_counter()
        store_to_nifti(store, out / (store.name[: -len(".ome.zarr")] + ".nii.gz"), geometry, dtype, out)
        seconds += time.perf_counter() - t
        voxels = int(np.prod(geometry.shape))
    per = seconds / max(voxels, 1)
    return {"seconds": round(seconds, 2), "voxels": voxels,
            "hours": {str(side): round(per * side**3 / 3600, 2) for side in MODEL_SIDES}}


def _own_slices(nz: int, s: dict) -> list[int]:
    n, L = s["slabs"], s["slab_slices"]
    return [min(nz, (i + 1) * L) - i * L for i in range(n)]


def _warm_ups(s: dict) -> list[int]:
    return s["slab_warm_up_slices"]


def _metrics_equal(a: dict, b: dict) -> bool:
    skip = {"seconds", "stage_seconds", "split"}
    return {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}


def _cpu_name() -> str:
    from ctpore.pipelines.precision import cpu_native_bf16

    name = "this CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} ({'avx512_bf16' if cpu_native_bf16() else 'no native bf16'}), {os.cpu_count()} cores"


def cpu_rates(res: dict) -> dict:
    """This machine's rates from the 1-worker split (one worker with every core): seconds per computed
    voxel of the prediction (warm-up included) and per voxel of the post-processing and writing, and
    the driver's serial seconds (the sample's fit and the grey range) per voxel of a plane."""
    one = res["split"]["1"]
    z0, y0, x0 = res["shape_zyx"]
    plane0 = y0 * x0
    computed = sum(L + w for L, w in zip(_own_slices(z0, one), _warm_ups(one)))
    return {"predict": sum(one["slab_seconds"]) / (computed * plane0),
            "post": one["stage_seconds"]["postprocess_and_write"] / (z0 * plane0),
            "serial_per_plane_voxel": one["stage_seconds"]["sample_and_range"] / plane0}


def gpu_rates(gpu: dict, cpu: dict) -> Optional[dict]:
    """A GPU node's rates from ``ctpore bench gpu``'s JSON: the model alone's seconds per voxel, and
    the rest of its whole ``reconstruct`` (reading, sample, post-processing, writing: the GPU node's
    host) per voxel; the driver's serial part at this machine's rate. None without both figures."""
    sp, rc = gpu.get("speed"), gpu.get("reconstruct")
    if not sp or not rc or "seconds_in_metrics" not in rc:
        return None
    predict = 1.0 / sp["voxels_per_s"]
    return {"predict": predict, "post": max(rc["seconds_in_metrics"] / rc["voxels"] - predict, 0.0),
            "serial_per_plane_voxel": cpu["serial_per_plane_voxel"], "gpu": gpu.get("versions", {}).get("gpu", "GPU")}


def scale_model(res: dict, side: int, nodes: int, rates: Optional[dict] = None) -> dict:
    """The model's wall time of a ``side``³ scan on ``nodes`` nodes, a slab a node (``side / nodes``
    slices, rounded up to the stores' alignment): the driver's serial part (scaled with the plane),
    then the slabs (each computing its warm-up too), then the post-processing and writing, at
    ``rates`` per voxel (default :func:`cpu_rates`: nodes like this machine)."""
    r = rates or cpu_rates(res)
    serial = r["serial_per_plane_voxel"] * side * side
    align, reach = res["store_align"], res["reach_slices"]
    slab = max(1, math.ceil(side / nodes / align)) * align  # a slab a node
    slabs = -(-side // slab)
    waves = -(-slabs // nodes)
    warm = min(reach, slab * (slabs - 1) / slabs)  # the first slab has none
    wall = serial + waves * (slab + warm) * side * side * r["predict"] + waves * slab * side * side * r["post"]
    return {"side": side, "nodes": nodes, "slab_slices": slab, "slabs": slabs, "warm_up_share": round(warm / slab, 3),
            "hours": round(wall / 3600, 2)}


def write_scale_report(res: dict, outdir: Union[str, os.PathLike], command: str) -> tuple[Path, Path]:
    """``OUTDIR/scale.json`` (the figures) and ``OUTDIR/scale.md`` (what they say, the model, the recipe)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    model = [scale_model(res, s, n) for s in MODEL_SIDES for n in MODEL_NODES]
    gpu_json = outdir / "gpu.json"
    gpu = gpu_rates(json.loads(gpu_json.read_text()), cpu_rates(res)) if gpu_json.is_file() else None
    gpu_model = [scale_model(res, s, n, gpu) for s in MODEL_SIDES for n in MODEL_NODES] if gpu else []
    res = {**res, "model": model, "gpu_model": gpu_model, "command": command}  # kept for --rewrite
    jpath = write_json_atomic(outdir / "scale.json", res)
    z, y, x = res["shape_zyx"]
    single = res["single"]
    lines = ["# One scan across a cluster", "",
             f"Written by `{command}` on {res['cpu']}.", "",
             "`ctpore reconstruct SCAN -o OUT --workers N` (a local Dask cluster) or `--scheduler ADDRESS` (a "
             "running one) cuts the scan into Z-slabs, computes each on a worker and joins them: the pores, "
             "probability and sample mask hold the voxels of a run in one process, and every metric is equal "
             "(tests/test_split_run.py). How: each slab's probabilities start "
             f"{res['reach_slices']} slices early (the model's reach along Z: each attention block looks back its "
             "window less one, and the blocks run in series), the sample and the grey range are fitted once by the "
             "driver, the post-processing's rules on whole components join the slabs' component summaries (two "
             "joins), and each slab writes its own chunk-aligned region of one OME-Zarr store per output.", "",
             "## What the split costs", "",
             f"A simulated {z} x {y} x {x} core in air; slabs of {res['split']['1']['slab_slices']} slices (the "
             "reach x 8, rounded up to the stores' alignment). Each run is a process of its own; CPU seconds "
             "count the process and its children (the cluster's workers).", "",
             "| run | wall (s) | CPU (s) | slabs | warm-up slices | halo CPU (s) | join CPU (s) | extra work | "
             "whole CPU vs one process | same voxels and metrics |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
             f"| one process | {single['wall_s']} | {single['cpu_s']} | | | | | | | |"]
    for n, r in res["split"].items():
        lines.append(f"| split, {n} worker{'s' if n != '1' else ''} | {r['wall_s']} | {r['cpu_s']} | {r['slabs']} | "
                     f"{r['warm_up_slices']} | {r['halo_cpu_s']} | {r['join_cpu_s']} | "
                     f"{100 * r['extra_share']:.1f}% | {r['whole_cpu_ratio']}x | "
                     f"{'yes' if r['same_voxels'] and r['same_metrics'] else 'NO'} |")
    per = res["split"]["2"] if "2" in res["split"] else next(iter(res["split"].values()))
    lines += ["", "The extra work is the CPU of the warm-up slices (each slab's CPU times the share of its computed "
              "slices that were warm-up) and the driver's CPU while the slabs post-process and it joins them, as a "
              "share of the one-process run's CPU seconds. The whole processes' ratio also counts what every "
              "worker pays once: its imports and its copy of the model.", "",
              f"Per-slab seconds (prediction, {len(per['slab_seconds'])} slabs on the cluster's workers): "
              f"median {statistics.median(per['slab_seconds']):.2f}, "
              f"CPU median {statistics.median(per['slab_cpu_seconds']):.2f}. Stage seconds of the split "
              f"runs: " + "; ".join(f"{n} worker(s): " + ", ".join(f"{k} {v}" for k, v in r["stage_seconds"].items())
                                   for n, r in res["split"].items()) + ".", "",
              "## A model of large scans", "",
              "From the 1-worker split (one worker with every core: one node like this machine): the prediction's "
              "seconds per computed voxel (warm-up included), the post-processing's and writing's per voxel, and "
              "the driver's serial part (the sample's fit and the grey range) scaled with the plane. A slab a node "
              "(Z / N slices, rounded up to the stores' alignment), each computing the reach's warm-up as well "
              "(its share of the slab in the table): with slabs under 8 x the reach the halo costs more than the "
              "measured split above.", "",
              "| scan | nodes (CPU, like this one) | slab slices | warm-up share | hours |",
              "|---|---:|---:|---:|---:|"]
    for m in model:
        lines.append(f"| {m['side']}^3 | {m['nodes']} | {m['slab_slices']} | {100 * m['warm_up_share']:.0f}% | "
                     f"{m['hours']} |")
    if gpu:
        lines += ["", f"On GPU nodes like the {gpu['gpu']} that `ctpore bench gpu` ran on ([gpu.json](gpu.json), "
                  f"[performance.md](performance.md#on-a-gpu)): the model alone's rate there "
                  f"({1 / gpu['predict']:.3g} voxels/s) for the prediction, and the rest of its whole `reconstruct` "
                  f"({1 / gpu['post']:.3g} voxels/s: reading, the sample, post-processing and writing on that node's "
                  "host) for the post-processing; the driver's serial part as above. Rates of one GPU run and one "
                  "host, not a split measured on GPU nodes: the host's work dominates, so a node's CPU cores and "
                  "disk decide its speed more than its GPU.", "",
                  "| scan | GPU nodes | slab slices | warm-up share | hours |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {m['side']}^3 | {m['nodes']} | {m['slab_slices']} | {100 * m['warm_up_share']:.0f}% | "
                  f"{m['hours']} |" for m in gpu_model]
    else:
        lines += ["", "On GPUs: not modelled yet. The model takes per-voxel rates measured by `ctpore bench gpu` "
                  "(`gpu.json` beside this page, [gpu.md](gpu.md)); until it has run, this page gives CPU nodes only."]
    lines += ["", "## What a split run needs", "",
              "- **Memory**: each worker keeps within `--memory-gb` as a run in one process does: the same tiles, "
              "chunks and post-processing slabs, whatever the slab's length (its slices wait in files, not in "
              "memory). The slab size (`--slab-slices`, default the reach x 8 or the slices per two slabs a "
              "worker, whichever is more) decides only where slabs start, and so the share of warm-up work.",
              "- **One file system** that the driver and every worker see at the same paths: the scan, the output "
              "folder and its work folder (`.<stem>.split/`). Each slab reads its scan slices and its warm-up "
              "(4 bytes a voxel of float32 copied to a nameless file in the work folder), writes its raw "
              "probabilities (4 bytes a voxel) and sample codes (1 byte) there, reads them back three times (the "
              "two joins and the writing) and writes its outputs (5 bytes a voxel, compressed): about 20 bytes of "
              "traffic a voxel, 170 GB for a 2048^3 scan, 1.4 TB for 4096^3, spread over the nodes.",
              "- **OME-Zarr outputs** (the default of a split run): each slab writes its own region of one store "
              "per output, chunk-aligned, so no two workers touch one chunk; napari and NGFF viewers open them "
              "lazily. With `--output-format nifti` the driver then streams each store into its `.nii.gz`, one "
              f"serial pass of gzip: {res['nifti']['seconds']} s for this scan's pores, probability and sample "
              f"here, so about {res['nifti']['hours']['2048']} hours for a 2048^3 scan and "
              f"{res['nifti']['hours']['4096']} hours for 4096^3, whatever the number of nodes (three quarters of "
              "this core's slices are outside it, zeros that compress fast: a scan whose sample fills its slices "
              "takes longer).",
              "- **Reruns**: the work folder keeps each finished slab's files and record under the plan's id (a "
              "hash of the scan, its size and time, the options and the weights); a rerun after the driver died "
              "computes only the slabs without a record, and a rerun with other options starts over. A worker that "
              "dies mid-slab has its slab run again by the scheduler, to the same bytes. The stores take their "
              "names only when every slab is written; the metrics file comes last. A scan that cannot be read "
              "mid-run ends the run in one line, its work removed.",
              "", "## On a SLURM cluster of GPU nodes", "",
              "With [dask-jobqueue](https://jobqueue.dask.org) a driver asks SLURM for workers, one per GPU node, and "
              "splits the scan across them. The driver plans tiles for the device it is given, so it runs as a job "
              "on a GPU node too (`sbatch --gres=gpu:1 --wrap \"python split_core.py\"`), with the scan and the "
              "output folder on the shared file system:", "",
              "```python",
              "# split_core.py",
              "from dask_jobqueue import SLURMCluster",
              "from distributed import Client",
              "from ctpore.pipelines.split import reconstruct_split",
              "",
              "cluster = SLURMCluster(queue=\"gpu\", cores=8, processes=1, memory=\"64GB\", walltime=\"04:00:00\",",
              "                       job_extra_directives=[\"--gres=gpu:1\"])",
              "cluster.scale(jobs=16)  # 16 GPU nodes",
              "with Client(cluster) as client:",
              "    client.wait_for_workers(16)",
              "    reconstruct_split(\"/scratch/me/core.h5\", \"/scratch/me/out\", client, device=\"cuda\")",
              "```", "",
              ("A split run on a GPU is checked by `sh scripts/gpu_check.sh`: a scan split across two workers that "
               "share one GPU holds the single run's voxels and metrics (tests/test_gpu_path.py); on several GPU "
               "nodes it has not been tried." if gpu else
               "A split run on GPUs has not been tried yet: `sh scripts/gpu_check.sh` checks it on a GPU machine."),
              ""]
    mpath = write_lines_atomic(outdir / "scale.md", lines)
    return jpath, mpath

