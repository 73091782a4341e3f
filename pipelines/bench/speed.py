"""``ctpore bench speed``: ``ctpore reconstruct`` beside what users run instead, in one run.

Every method runs as a whole process on the same generated scan (a simulated ``.nii.gz``, uint16,
as a scanner writes it), reading it and writing its pores, probability map and metrics: the time
a user waits and the peak memory (resident set) the process needs. The methods run interleaved,
``repeats`` times each after one untimed warm-up, and the medians are reported, because this
kind of machine's speed drifts from minute to minute.

- ``ctpore reconstruct`` with default settings (bf16 on a CPU with native bf16, the C window
  kernel where it is built), and with ``--precision fp32`` (the stored model as it is);
- MONAI's 3D U-Net as users set it up (:mod:`ctpore.pipelines.bench.references`) and the
  benchmark's trained 3D U-Net (``ctpore reconstruct --method unet3d``);
- the filtered-Otsu pipeline users run in Fiji (``ctpore reconstruct --method otsu``).

Beside them: PoreFormer's arithmetic per voxel (convolutions and matrix products counted by
PyTorch's FLOP counter, the attention's products from its windows) and the share of this
machine's measured fp32 and bf16 matrix-multiply peak that the model alone reaches.
``docs/performance.md`` and ``docs/performance.json`` are written from the results (with the GPU
figures of ``ctpore bench gpu`` when ``docs/gpu.json`` exists).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ctpore.atomic import atomic_write, write_json_atomic, write_lines_atomic
from ctpore.errors import InputError
from ctpore.progress import ProgressFn
from ctpore.runtime import openmp_policy_is_ours

__all__ = ["bench_speed", "gpu_section", "write_performance", "poreformer_flops_per_voxel", "matmul_peak"]

#: The command variants timed (not methods of the method table): name -> how to run it ({scan} and
#: {out} are filled in); "ctpore" runs ``ctpore reconstruct``.
COMMANDS: dict[str, list[str]] = {
    "ctpore reconstruct (default)": ["ctpore"],
    "ctpore reconstruct (fp32)": ["ctpore", "--precision", "fp32"],
    "MONAI 3D U-Net (16-32-64-128, 96^3 windows)": ["reference", "monai-unet"],
    "3D U-Net baseline (trained)": ["ctpore", "--method", "unet3d"],
    "Filtered Otsu (Fiji pipeline)": ["ctpore", "--method", "otsu"],
}


def _command(spec: list[str], scan: Path, out: Path) -> list[str]:
    if spec[0] == "ctpore":
        return [sys.executable, "-m", "ctpore.app.cli", "reconstruct", str(scan), "-o", str(out), "--overwrite",
                *spec[1:]]
    return [sys.executable, "-m", "ctpore.pipelines.bench.references", spec[1], str(scan), str(out)]


#: Run by a small Python process between the caller and the measured command. On Linux a child's
#: peak resident set starts at that of the process it was forked from (exec records the old
#: memory's high-water mark), so a command started straight from a large process would be
#: charged that process's memory; the launcher is small, forks the command and reports its
#: wall seconds and peak RSS on its stdout.
_LAUNCHER = """
import json, os, sys, time
t = time.perf_counter()
pid = os.fork()
if pid == 0:
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    finally:
        os._exit(127)
_pid, status, usage = os.wait4(pid, 0)
print(json.dumps([time.perf_counter() - t, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status)]))
"""


def _machine() -> str:
    """The CPU by name, whether it has native bf16 (the default precision follows it), its cores."""
    from ctpore.pipelines.bench.analysis import cpu_name
    from ctpore.pipelines.precision import cpu_native_bf16

    return f"{platform.machine()}, {cpu_name()}, {'native' if cpu_native_bf16() else 'no native'} bf16"


def _run(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and peak resident memory (bytes) of one process running ``cmd``."""
    env = dict(os.environ, CTPORE_NO_PROGRESS="1")
    if openmp_policy_is_ours():  # each program as its users run it: ctpore's command sets its own
        env.pop("OMP_WAIT_POLICY", None)
    proc = subprocess.run([sys.executable, "-c", _LAUNCHER, *cmd], capture_output=True, text=True, env=env,
                          check=False)
    try:
        seconds, rss, code = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        seconds, rss, code = 0.0, 0, proc.returncode or 1
    if code:
        raise RuntimeError(f"{' '.join(cmd)} failed ({code}): {proc.stderr.strip()[-500:]}")
    return float(seconds), int(rss)


def matmul_peak(dtype_name: str = "float32", n: int = 2048, repeats: int = 5) -> float:
    """This machine's matrix-multiply speed in FLOP/s (best of ``repeats`` ``n x n`` products)."""
    import torch

    dtype = getattr(torch, dtype_name)
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def poreformer_flops_per_voxel(model, chunk: int = 16) -> dict:
    """FLOPs per voxel of one forward pass: PyTorch's counter for convolutions and products, plus
    the attention's two products over each block's window (the CPU kernel is not counted)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.zeros(1, chunk, 64, 64)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(x)
    counted = counter.get_total_flops() / x.numel()
    attention = 0.0
    cfg = model.config
    blocks = [(b, 4**lv) for lv, level in enumerate(model.level_blocks, start=1) for b in level]
    blocks += [(b, 1) for b in model.blocks]
    for blk, per in blocks:
        keys = min(blk.attn.window or chunk, chunk)
        attention += 4 * blk.attn.head_dim * cfg.n_heads * keys / per  # QK^T and AV, 2 FLOPs a MAC
    return {"counted": counted, "attention": attention, "total": counted + attention}


def _reconstruct_plan(scan: Path, memory_gb: float = 1.5) -> tuple[int, int]:
    """The ``(tile, chunk_slices)`` that ``ctpore reconstruct`` picks for ``scan`` by default (a
    function of the scan's shape and the budget only, :func:`ctpore.pipelines.budget.plan_budget`)."""
    from ctpore.data.io import load_scan
    from ctpore.models.weights import load_for_inference
    from ctpore.pipelines.budget import plan_budget
    from ctpore.pipelines.stream_plan import plan_for_device

    with load_scan(scan) as s:
        shape = tuple(s.shape)
    model = load_for_inference(None, "cpu", None)[0]
    return plan_for_device(model, shape, plan_budget(shape, memory_gb)[1])


def _model_speed(model, shape, tile, chunk) -> float:
    from ctpore.pipelines.stream import predict

    vol = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    predict(model, vol[: min(chunk, shape[0])], chunk_slices=chunk, tile=tile)
    t = time.perf_counter()
    predict(model, vol, chunk_slices=chunk, tile=tile)
    return vol.size / (time.perf_counter() - t)


def bench_speed(
    shape: tuple[int, int, int] = (96, 256, 256),
    repeats: int = 3,
    workdir: str | Path = "runs/speed",
    methods: Sequence[str] | None = None,
    seed: int = 0,
    progress: ProgressFn = None,
) -> dict[str, Any]:
    """Time every command in :data:`COMMANDS` (or ``methods``) on one generated scan; see the module docstring."""
    import nibabel as nib
    import torch

    from ctpore.data.synthetic import make_pair
    from ctpore.models.weights import default_weights_path, load_model
    if repeats < 1:
        raise InputError(f"repeats must be >= 1, got {repeats}")
    names = list(COMMANDS) if methods is None else list(methods)
    unknown = [m for m in names if m not in COMMANDS]
    if unknown:
        raise InputError(f"unknown methods {unknown}; choose from {list(COMMANDS)}")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    scan = workdir / f"scan_{'x'.join(map(str, shape))}.nii.gz"
    if not scan.exists():
        vol, _truth, _info = make_pair(seed, shape=tuple(shape))
        img = nib.Nifti1Image(np.ascontiguousarray(vol.T), np.diag([0.01, 0.01, 0.01, 1.0]))
        img.header.set_xyzt_units("mm")
        with atomic_write(scan) as tmp:
            nib.save(img, str(tmp))
    total, done = len(names) * (repeats + 1) + 2, 0
    runs: dict[str, dict[str, list]] = {m: {"seconds": [], "peak_rss_bytes": []} for m in names}
    for rep in range(repeats + 1):  # the first round warms the disk cache and is not kept
        for m in names:
            dt, rss = _run(_command(COMMANDS[m], scan, workdir / "out"))
            if rep:
                runs[m]["seconds"].append(dt)
                runs[m]["peak_rss_bytes"].append(rss)
            done += 1
            if progress is not None:
                progress(done, total, m)
    nvox = int(np.prod(shape))
    rows = {}
    for m in names:
        sec = statistics.median(runs[m]["seconds"])
        rows[m] = {"seconds_median": sec, "voxels_per_s": nvox / sec,
                   "peak_rss_gb": statistics.median(runs[m]["peak_rss_bytes"]) / 2**30, **runs[m]}
    # Memory with default settings: the same plane with four times the slices, and a wide plane.
    from ctpore.models import window_kernel
    from ctpore.pipelines.bench.gpu import make_test_scan
    from ctpore.pipelines.precision import precision_name

    memory = []
    for extra in ((4 * shape[0], shape[1], shape[2]), (8, 1024, 1024)):
        path = make_test_scan(workdir / f"mem_{'x'.join(map(str, extra))}.nii", extra)
        sec, rss = _run(_command(["ctpore"], path, workdir / "out"))
        memory.append({"shape": list(extra), "seconds": sec, "peak_rss_gb": rss / 2**30})
        path.unlink()
        done += 1
        if progress is not None:
            progress(done, total, f"memory {extra}")
    model = load_model(default_weights_path())
    tile, chunk = _reconstruct_plan(scan)
    flops = poreformer_flops_per_voxel(model, chunk)
    model_vps = _model_speed(model, shape, tile, chunk)
    precision = precision_name("auto", torch.device("cpu"))
    peaks = {d: matmul_peak(d) for d in ("float32", "bfloat16")}
    res = {
        "shape": list(shape), "voxels": nvox, "repeats": repeats,
        "machine": _machine(),
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "methods": rows,
        "memory_default": memory,
        "poreformer": {"flops_per_voxel": flops, "model_voxels_per_s": model_vps, "tile": tile, "chunk_slices": chunk,
                       "params": model.n_params(), "precision": precision, "window_kernel": window_kernel.available()},
        "matmul_peak_flops": peaks,
        "peak_fraction": {d: flops["total"] * model_vps / p for d, p in peaks.items()},
    }
    ref = next((m for m in names if m.startswith("MONAI")), None)
    for m in names:
        if ref is not None:
            rows[m]["vs_monai_unet"] = rows[m]["voxels_per_s"] / rows[ref]["voxels_per_s"]
    return res


def write_performance(res: dict, outdir: str | Path = "docs", command: str = "ctpore bench speed") -> Path:
    """``performance.json`` and ``performance.md`` in ``outdir`` (the GPU section from ``gpu.json`` there)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    res = {**res, "command": command}  # kept, so that --rewrite names the command that measured
    write_json_atomic(outdir / "performance.json", res)
    z, y, x = res["shape"]
    pf = res["poreformer"]
    lines = [
        "# Performance: `ctpore reconstruct` beside what users run instead",
        "",
        f"Reproduce: `{command}` ({res['machine']}, torch {res['torch']}, {res['torch_threads']} threads).",
        "",
        f"Each method is a whole process on the same simulated {z} x {y} x {x} uint16 scan (`.nii.gz`): it",
        "reads the scan, segments it, writes the pores and the probability map (`.nii.gz`) and the metrics.",
        f"Medians of {res['repeats']} interleaved runs after a warm-up; peak memory is the process's peak",
        "resident set.",
        "",
        "| method | seconds | voxels / s | vs MONAI 3D U-Net | peak memory (GB) |",
        "|---|---:|---:|---:|---:|",
    ]
    for m, r in res["methods"].items():
        vs = f"{r['vs_monai_unet']:.2f}x" if "vs_monai_unet" in r else "-"
        lines.append(f"| {m} | {r['seconds_median']:.2f} | {r['voxels_per_s']:.3g} | {vs} | {r['peak_rss_gb']:.2f} |")
    lines += ["", "Peak memory of `ctpore reconstruct` with default settings (`--memory-gb 1.5`) on other shapes "
              "(uncompressed uint16 scans):", "", "| scan | seconds | peak memory (GB) |", "|---|---:|---:|"]
    default = next((r for m, r in res["methods"].items() if m.startswith("ctpore reconstruct (default)")), None)
    if default is not None:
        lines.append(f"| {z} x {y} x {x} (above) | {default['seconds_median']:.2f} | {default['peak_rss_gb']:.2f} |")
    for r in res.get("memory_default", []):
        lines.append(f"| {' x '.join(map(str, r['shape']))} | {r['seconds']:.2f} | {r['peak_rss_gb']:.2f} |")
    fl = pf["flops_per_voxel"]
    prec = pf.get("precision", "fp32")
    peak = "bfloat16" if prec == "bf16" else "float32"
    kernel = ", attention in ctpore's C window kernel" if pf.get("window_kernel") else ""
    lines += [
        "",
        "## PoreFormer's arithmetic",
        "",
        f"{fl['total'] / 1e3:.1f} kFLOP per voxel ({fl['counted'] / 1e3:.1f} k in convolutions and matrix products, "
        f"{fl['attention'] / 1e3:.1f} k in the attention's products), {pf['params']:,} parameters. "
        f"The model alone streams {pf['model_voxels_per_s']:.3g} voxels/s here ({prec}, tile {pf['tile']}, "
        f"{pf['chunk_slices']} slices a chunk{kernel}), "
        f"{100 * res['peak_fraction'][peak]:.0f}% of this machine's measured {prec} matrix-multiply peak "
        f"({res['matmul_peak_flops'][peak] / 1e9:.0f} GFLOP/s; fp32: "
        f"{res['matmul_peak_flops']['float32'] / 1e9:.0f} GFLOP/s, bf16: "
        f"{res['matmul_peak_flops']['bfloat16'] / 1e9:.0f} GFLOP/s). The rest goes to memory traffic: "
        "layouts changed between the in-plane convolutions and the per-column attention, norms, "
        "upsampling.",
    ]
    gpu = outdir / "gpu.json"
    lines += ["", "## On a GPU", ""]
    lines += gpu_section(json.loads(gpu.read_text())) if gpu.exists() else [
        "No CUDA GPU was available where these figures were made: the GPU path (bf16 autocast, so that",
        "FlashAttention or PyTorch's SDPA kernels run) is tested here with mocks and a stand-in kernel only.",
        "`sh scripts/gpu_check.sh` is the one prepared run for a GPU machine (no network, under about 10",
        "minutes by construction): a versions probe, the real-kernel tests, then `ctpore bench gpu`, which",
        "writes its figures step by step to `gpu.json`; copied to `docs/gpu.json`, they appear here (flash",
        "vs sdpa agreement, voxels per second, GPU peak memory) at the next `ctpore bench speed`."]
    path = outdir / "performance.md"
    write_lines_atomic(path, lines)
    return path


def _e(v) -> str:
    return f"{v:.2e}" if isinstance(v, (int, float)) else "-"


def gpu_section(g: dict) -> list[str]:
    """The "On a GPU" lines of ``performance.md`` from ``ctpore bench gpu``'s JSON (partial or whole)."""
    v = g.get("versions", {})
    flash = v.get("flash_attn", {})
    lines = [f"`{g.get('command', 'ctpore bench gpu')}` on {v.get('gpu', 'a GPU')} (torch {v.get('torch', '?')}, "
             f"CUDA {v.get('cuda', '?')}, flash-attn {flash.get('version') or 'not installed'}).", ""]
    sp, rc = g.get("speed"), g.get("reconstruct")
    if sp or rc:
        lines += ["| run | scan | seconds | voxels / s | peak memory (GB) | backend that ran |",
                  "|---|---|---:|---:|---:|---|"]
        if sp:
            lines.append(f"| model alone (tile {sp['tile']}, {sp['chunk_slices']} slices a chunk, {sp['precision']}) | "
                         f"{' x '.join(map(str, sp['shape']))} | {sp['seconds']:.2f} | {sp['voxels_per_s']:.3g} | "
                         f"GPU {sp.get('gpu_peak_gb', float('nan')):.2f} (estimate {sp['estimate_gb']:.2f}) | "
                         f"{sp['ran']} |")
        if rc:
            lines.append(f"| ctpore reconstruct, whole process (--memory-gb {rc['memory_gb']:g}) | "
                         f"{' x '.join(map(str, rc['shape']))} | {rc['seconds']:.2f} | {rc['voxels_per_s']:.3g} | "
                         f"host {rc.get('peak_rss_gb', float('nan')):.2f} | {rc['attention_backend']} |")
        lines.append("")
        if sp and rc and "seconds_in_metrics" in rc:
            model_s = rc["voxels"] / sp["voxels_per_s"]
            lines += [f"Of the whole process's {rc['seconds']:.1f} s, {rc['seconds_in_metrics']:.1f} s were inside "
                      f"`reconstruct` (the rest: Python, imports, CUDA's start), and the model at the speed above "
                      f"needs about {model_s:.1f} s of them: on a GPU the host's work (reading, post-processing, "
                      "writing) bounds the whole run.", ""]
    rows = [(f"attention kernel ({k.replace('_', ' ')}, bf16)", c.get("math_bf16_error"),
             c.get("sdpa", {}).get("error"), c.get("flash", {}).get("error"), c.get("flash_minus_sdpa"))
            for k, c in g.get("kernels", {}).items()
            if isinstance(c, dict)]
    if "model" in g:
        m = g["model"]
        rows.append(("whole model (probabilities, bf16 autocast)", m["math"].get("max_abs_error_bf16"),
                     m["sdpa"].get("max_abs_error_bf16"), m["flash"].get("max_abs_error_bf16"),
                     m.get("flash_minus_sdpa")))
    if rows:
        lines += ["Largest error against the math path in fp32 (TF32 off); flash-attention's bound is twice the error "
                  "of plain PyTorch (math) in the same precision:", "",
                  "| compared | math | sdpa | flash | flash - sdpa |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {name} | {_e(a)} | {_e(b)} | {_e(c)} | {_e(d)} |" for name, a, b, c, d in rows]
        lines.append("")
    if "sdpa_kernel" in g:
        k = g["sdpa_kernel"]
        ok = [n for n, a in k.get("accepted_when_forced", {}).items() if a is True]
        lines += [f"PyTorch's SDPA kernel inside the model: {k['ran']} (profiler); kernels that accept its calls when "
                  f"forced alone: {', '.join(ok) or 'none'}.", ""]
    for e in g.get("errors", []):
        lines.append(f"- step `{e['step']}` did not finish: {e['error']}")
    return lines
