"""``ctpore bench gpu``: the checks and figures that need a CUDA GPU, in one short run.

Made for a short lease on a GPU machine (no network, minutes): every step runs in its own
process with its own timeout, all within ``time_limit`` seconds, and the JSON file is rewritten
(atomically) after each step with the steps done so far. A step that fails or times out is
recorded with its one-line reason (``errors``) and the next step runs. This process never
touches the GPU itself (no CUDA context here: the steps get all of its memory).

Steps, most valuable first (see :mod:`ctpore.pipelines.gpu_checks` for the first five):

1. ``versions``: torch, CUDA, cuDNN, the GPU, flash-attn importable or why not.
2. ``kernels``: the attention kernel alone, flash vs sdpa vs each of PyTorch's SDPA kernels in
   bf16 against fp32 math with TF32 off; flash-attention's bound (at most twice plain PyTorch's
   error in the same precision) and the direct flash - sdpa difference.
3. ``sdpa_kernel``: which SDPA kernel ran inside the model (profiler), which accept its calls.
4. ``model``: the shipped model, each backend in bf16 against fp32 math with TF32 off.
5. ``speed``: the model alone on ``model_shape`` (default 256 x 1024 x 1024) with the plan
   ``reconstruct`` takes on this GPU: voxels per second, GPU peak memory and the estimate.
6. ``scan``: a generated ``reconstruct_shape`` scan (default 128 x 512 x 512, uint16,
   uncompressed NIfTI, so that reading it costs little).
7. ``reconstruct``: the whole process ``ctpore reconstruct --device ...`` on it: voxels per
   second, the backend that ran, the peak host memory.

``ctpore bench speed`` folds the JSON (``docs/gpu.json``) into ``docs/performance.md``.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ctpore.atomic import write_json_atomic
from ctpore.errors import InputError
from ctpore.progress import ProgressFn

__all__ = ["STEP_TIMEOUTS", "bench_gpu", "make_test_scan", "reconstruct_result", "run_step", "step_command"]

#: Seconds each step may take at most (and never past the run's time limit). On one H200 the
#: steps are expected to take well under these; they bound what a hang or a slow step can cost.
STEP_TIMEOUTS = {"versions": 60, "kernels": 90, "sdpa_kernel": 90, "model": 120, "speed": 180, "scan": 90,
                 "reconstruct": 180}

#: A step is not started with less than this many seconds left.
MIN_STEP_SECONDS = 10


def make_test_scan(path: Path, shape: tuple[int, int, int], seed: int = 0) -> Path:
    """Write a simulated scan of ``shape`` as an uncompressed uint16 NIfTI, slice-chunk by chunk.

    A 128^3 simulated scan (:func:`ctpore.data.synthetic.make_pair`) is repeated to fill the
    shape (mirrored, so the structure runs on across the seams); any size costs the same to make.
    """
    import nibabel as nib

    from ctpore.atomic import atomic_write
    from ctpore.data.synthetic import make_pair

    block, _truth, _info = make_pair(seed, shape=(128, 128, 128))
    block = block.astype(np.uint16)
    nz, ny, nx = shape

    def mirrored(n: int, size: int) -> np.ndarray:
        i = np.arange(n) % (2 * size)
        return np.where(i < size, i, 2 * size - 1 - i)

    iy, ix = mirrored(ny, 128), mirrored(nx, 128)
    header = nib.Nifti1Header()
    header.set_data_shape((nx, ny, nz))
    header.set_data_dtype(np.uint16)
    header.set_xyzt_units("mm")
    header.set_qform(np.diag([0.01, 0.01, 0.01, 1.0]), code=1)
    header.set_sform(np.diag([0.01, 0.01, 0.01, 1.0]), code=1)
    offset = int(header.get_data_offset()) or 352
    header.set_data_offset(offset)
    with atomic_write(path) as tmp, open(tmp, "wb") as fh:
        fh.write(header.binaryblock)
        fh.write(b"\0" * (offset - len(header.binaryblock)))
        iz = mirrored(nz, 128)
        for z0 in range(0, nz, 32):
            slab = block[iz[z0:z0 + 32]][:, iy][:, :, ix]  # (n, Y, X)
            fh.write(np.ascontiguousarray(slab).tobytes())  # NIfTI order: x fastest, then y, z
    return path


def step_command(step: str, args: dict) -> list[str]:
    """The command line of one step (a child process of this Python)."""
    py = sys.executable
    if step == "scan":
        code = ("import sys, json; from pathlib import Path; from ctpore.pipelines.bench.gpu import make_test_scan; "
                "a = json.loads(sys.argv[1]); make_test_scan(Path(a['path']), tuple(a['shape'])); "
                "print(json.dumps({'file': Path(a['path']).name, 'shape': a['shape']}))")  # docs/ names no path
        return [py, "-c", code, json.dumps(args)]
    if step == "reconstruct":
        cmd = [py, "-m", "ctpore.app.cli", "reconstruct", args["scan"], "-o", args["outdir"],
               "--device", args["device"],
               "--memory-gb", str(args["memory_gb"]), "--overwrite"]
        if args.get("gpu_memory_gb") is not None:
            cmd += ["--gpu-memory-gb", str(args["gpu_memory_gb"])]
        return ["/usr/bin/time", "-f", "%M", *cmd] if Path("/usr/bin/time").exists() else cmd
    return [py, "-m", "ctpore.pipelines.gpu_checks", step, json.dumps(args)]


def run_step(argv: list[str], timeout: float) -> tuple[int | None, str, str]:
    """Run ``argv`` in a new process group; ``(returncode, stdout, stderr)``, returncode None when it
    ran past ``timeout`` seconds (then the whole group, grandchildren too, is killed)."""
    env = dict(os.environ, CTPORE_NO_PROGRESS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return None, out, err


def _reason(stderr: str, returncode: int) -> str:
    """The one line that says why a step failed: ctpore's own error line, else the last line."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.startswith("ctpore: error:")]
    lines = [ln for ln in lines if not ln.isdigit() and not ln.startswith("Command exited with")]  # GNU time's
    line = (said or lines or [f"exit code {returncode}, nothing on stderr"])[-1]
    return line if len(line) <= 300 else line[:297] + "..."


def _last_json(stdout: str) -> dict:
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("the step printed no JSON result")


def reconstruct_result(args: dict, stderr: str, seconds: float) -> dict:
    """The figures of a finished reconstruct step: from its metrics file, and the peak resident
    memory GNU time wrote last on stderr (when it ran under /usr/bin/time)."""
    shape = args["shape"]
    metrics = json.loads((Path(args["outdir"]) / f"{Path(args['scan']).name[: -len('.nii')]}_metrics.json").read_text())
    res = {"shape": list(shape), "voxels": int(np.prod(shape)), "seconds": round(seconds, 3),
           "voxels_per_s": float(np.prod(shape)) / seconds, "seconds_in_metrics": metrics["seconds"],
           "attention_backend": metrics["attention_backend"], "device": metrics["device"],
           "memory_gb": args["memory_gb"]}
    lines = stderr.strip().splitlines()
    if lines and lines[-1].strip().isdigit():
        res["peak_rss_gb"] = round(int(lines[-1]) / 2**20, 3)
    return res


def bench_gpu(
    workdir: Path,
    out: Path | None = None,
    device: str = "cuda",
    model_shape: tuple[int, int, int] = (256, 1024, 1024),
    reconstruct_shape: tuple[int, int, int] = (128, 512, 512),
    memory_gb: float = 16.0,
    gpu_memory_gb: float | None = None,
    time_limit: float = 300.0,
    progress: ProgressFn = None,
    command: str | None = None,
) -> dict:
    """Run the GPU checks (see the module docstring); return their figures, and write them to
    ``out`` after every step.

    Parameters
    ----------
    workdir : Path
        Where the generated scan and the reconstruct outputs go (the scan is removed after).
    out : Path, optional
        The JSON file, rewritten atomically after each step with the steps done so far.
    device : str
        The CUDA device (``cuda``, ``cuda:1``, ...); every step runs on it.
    model_shape, reconstruct_shape : (int, int, int)
        ``(Z, Y, X)`` of the model-alone timing and of the whole-process reconstruct.
    memory_gb, gpu_memory_gb : float
        ``--memory-gb`` (host) and ``--gpu-memory-gb`` of the reconstruct step; the GPU cap also
        applies to the model-alone plan.
    time_limit : float
        Seconds for all the steps together; each step also has its own timeout
        (:data:`STEP_TIMEOUTS`). A step not started for want of time is recorded as an error.

    Raises
    ------
    InputError
        When ``device`` is not a usable CUDA device.
    """
    from ctpore.pipelines.precision import resolve_device

    dev = resolve_device(device)  # asks the driver how many GPUs there are; makes no CUDA context
    if dev.type != "cuda":
        raise InputError(f"ctpore bench gpu needs a CUDA device (--device cuda), got {device!r}")
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    scan = workdir / f"scan_{'x'.join(map(str, reconstruct_shape))}.nii"
    d = str(dev)
    steps = [
        ("versions", {"device": d}),
        ("kernels", {"device": d}),
        ("sdpa_kernel", {"device": d}),
        ("model", {"device": d}),
        ("speed", {"device": d, "shape": list(model_shape), "gpu_memory_gb": gpu_memory_gb}),
        ("scan", {"path": str(scan), "shape": list(reconstruct_shape)}),
        ("reconstruct", {"scan": str(scan), "outdir": str(workdir / "out"), "device": d, "memory_gb": memory_gb,
                         "gpu_memory_gb": gpu_memory_gb, "shape": list(reconstruct_shape)}),
    ]
    res: dict = {"command": command or "ctpore bench gpu", "device": d, "time_limit_s": time_limit,
                 "machine": f"{platform.machine()}, {os.cpu_count()} cores", "steps": {}, "errors": []}
    deadline = time.monotonic() + time_limit
    try:
        for i, (name, args) in enumerate(steps):
            error, t0 = None, time.monotonic()
            left = deadline - t0
            if name == "reconstruct" and "scan" not in res:
                error = "not run: there is no test scan (step scan failed)"
            elif left < MIN_STEP_SECONDS:
                error = f"not run: the time limit of {time_limit:.0f} s was spent"
            else:
                timeout = min(STEP_TIMEOUTS[name], left)
                rc, stdout, stderr = run_step(step_command(name, args), timeout)
                seconds = time.monotonic() - t0
                if rc is None:
                    error = f"timed out after {timeout:.0f} s"
                elif rc != 0:
                    error = _reason(stderr, rc)
                else:
                    try:
                        res[name] = reconstruct_result(args, stderr, seconds) if name == "reconstruct" \
                            else _last_json(stdout)
                    except (ValueError, OSError, KeyError) as exc:
                        error = f"no result: {exc}"
            res["steps"][name] = {"ok": error is None, "seconds": round(time.monotonic() - t0, 1)}
            if error is not None:
                res["errors"].append({"step": name, "error": error})
            if out is not None:
                write_json_atomic(out, res)
            if progress is not None:
                progress(i + 1, len(steps), name)
    finally:
        scan.unlink(missing_ok=True)
    return res
