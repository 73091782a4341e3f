"""``ctpore bench gpu``: the checks and figures that need a CUDA GPU, in one short run.

1. **Agreement.** The shipped PoreFormer with each attention backend (flash, sdpa, math) on the
   same input: the error of flash and of sdpa in bf16 against the math path in fp32, and the
   rule flash-attention's own tests use: flash's error at most twice plain PyTorch's in the same
   precision.
2. **Which kernel ran.** ``ctpore reconstruct --device cuda`` reports the attention backend that
   really ran (bf16 autocast brings the tensors to FlashAttention).
3. **Speed.** Whole-process voxels per second of ``ctpore reconstruct --device cuda`` on
   generated scans (default 512^3 and 2048 x 1024 x 1024, uint16, uncompressed NIfTI so that
   reading them costs little), and the model alone (``predict`` in the process).

Everything is written to a JSON file that ``ctpore bench speed`` folds into
``docs/performance.md``. Prepared so that one run on a lent GPU machine gives every figure.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from ctpore.atomic import write_json_atomic
from ctpore.errors import InputError
from ctpore.progress import ProgressFn

__all__ = ["bench_gpu", "make_test_scan"]


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


def _agreement(device: str) -> dict:
    import copy

    import torch

    from ctpore.models.weights import default_weights_path, load_model

    path = default_weights_path()
    ref = load_model(path, device=device, attention_backend="math")
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 32, 256, 256)).astype(np.float32)).to(device)
    with torch.inference_mode():
        truth = ref(x).float()
        out = {}
        for backend in ("sdpa", "flash"):
            try:
                m = load_model(path, device=device, attention_backend=backend)
            except InputError as exc:
                out[backend] = {"available": False, "reason": str(exc)}
                continue
            low = copy.deepcopy(m).bfloat16()
            low.reset_backends_ran()
            err = (low(x.bfloat16()).float() - truth).abs().max().item()
            out[backend] = {"available": True, "max_abs_error_bf16": err, "ran": low.backends_ran()}
    if out.get("flash", {}).get("available"):
        out["flash_within_twice_sdpa"] = out["flash"]["max_abs_error_bf16"] <= 2 * out["sdpa"]["max_abs_error_bf16"]
    return out


def _model_speed(device: str, shape: tuple[int, int, int]) -> dict:
    import torch

    from ctpore.models.weights import default_weights_path, load_model
    from ctpore.pipelines.stream import predict

    model = load_model(default_weights_path(), device=device)
    vol = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    predict(model, vol[: min(32, shape[0])], chunk_slices=32, tile=1024, device=device)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    model.reset_backends_ran()
    t = time.perf_counter()
    predict(model, vol, chunk_slices=32, tile=1024, device=device)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    return {"shape": list(shape), "seconds": dt, "voxels_per_s": vol.size / dt, "ran": model.backends_ran(),
            "gpu_peak_gb": torch.cuda.max_memory_allocated() / 2**30}


def bench_gpu(
    workdir: Path,
    sizes: Sequence[tuple[int, int, int]] = ((512, 512, 512), (2048, 1024, 1024)),
    device: str = "cuda",
    memory_gb: float = 32.0,
    out: Path | None = None,
    progress: ProgressFn = None,
) -> dict:
    """Run the GPU checks; return (and write to ``out``) their figures. See the module docstring."""
    import torch

    from ctpore.pipelines.stream import resolve_device

    dev = resolve_device(device)
    if dev.type != "cuda":
        raise InputError("ctpore bench gpu needs a CUDA device (--device cuda)")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    res: dict = {
        "gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "cuda": torch.version.cuda,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    steps = 1 + 2 * len(sizes)
    res["agreement"] = _agreement(str(dev))
    if progress is not None:
        progress(1, steps, "backends agree")
    res["reconstruct"] = []
    for i, shape in enumerate(sizes):
        res["reconstruct"].append({"model_only": _model_speed(str(dev), (min(shape[0], 256), *shape[1:]))})
        scan = make_test_scan(workdir / f"scan_{'x'.join(map(str, shape))}.nii", tuple(shape))
        cmd = [sys.executable, "-m", "ctpore.app.cli", "reconstruct", str(scan), "-o", str(workdir / "out"),
               "--device", str(dev), "--memory-gb", str(memory_gb), "--overwrite"]
        t = time.perf_counter()
        proc = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd] if Path("/usr/bin/time").exists() else cmd,
                              capture_output=True, text=True, env=dict(os.environ, CTPORE_NO_PROGRESS="1"))
        dt = time.perf_counter() - t
        entry = res["reconstruct"][-1]
        entry.update(shape=list(shape), voxels=int(np.prod(shape)), seconds=dt, returncode=proc.returncode,
                     voxels_per_s=float(np.prod(shape)) / dt)
        if proc.returncode == 0:
            stem = scan.name[: -len(".nii")]
            metrics = json.loads((workdir / "out" / f"{stem}_metrics.json").read_text())
            entry["attention_backend"] = metrics["attention_backend"]
            entry["device"] = metrics["device"]
        else:
            entry["stderr"] = proc.stderr.strip()[-2000:]
        lines = proc.stderr.strip().splitlines()
        if lines and lines[-1].isdigit():
            entry["peak_rss_gb"] = int(lines[-1]) / 2**20
        scan.unlink(missing_ok=True)
        if progress is not None:
            progress(2 + 2 * i, steps, f"reconstruct {entry['shape']}")
    if out is not None:
        write_json_atomic(out, res)
    return res
