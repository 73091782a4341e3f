"""``ctpore reconstruct`` of two source trees, interleaved, on one generated scan: the median wall
time of each over ``--rounds`` rounds (the ``ctpore bench speed`` variants that run ctpore's own
code: default settings, ``--precision fp32``, ``--method otsu``).

    python scripts/speed_before_after.py OUT.json --before DIR --after DIR [--rounds 3]

``DIR`` holds a folder ``ctpore`` (a checkout, with its C kernel built) and is put first on
``PYTHONPATH`` for that side's runs. Writes the times, their medians, the ratio after/before and
this machine's CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = {"default": [], "fp32": ["--precision", "fp32"], "otsu": ["--method", "otsu"]}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                flags = Path("/proc/cpuinfo").read_text()
                bf16 = " (avx512_bf16)" if "avx512_bf16" in flags else " (AVX2, no avx512_bf16)"
                return line.split(":", 1)[1].strip() + bf16
    except OSError:
        pass
    return platform.processor() or "unknown"


def commit_of(folder: Path) -> str:
    """The git commit of a checkout (its path on this machine means nothing elsewhere)."""
    out = subprocess.run(["git", "-C", str(folder.resolve()), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True)
    return out.stdout.strip() if out.returncode == 0 else "not a git checkout"


def run(tree: Path, scan: Path, out: Path, extra: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree), CTPORE_NO_PROGRESS="1")
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ctpore.app.cli", "reconstruct", str(scan), "-o", str(out), "--overwrite",
                    *extra], env=env, check=True, capture_output=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shape", default="96x256x256")  # bench speed's default
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        scan = tmp / "scan.nii.gz"
        import nibabel as nib
        import numpy as np

        from ctpore.data.synthetic import make_pair

        vol, _truth, _info = make_pair(0, shape=tuple(int(v) for v in a.shape.split("x")))  # as bench speed makes it
        img = nib.Nifti1Image(np.ascontiguousarray(vol.T), np.diag([0.01, 0.01, 0.01, 1.0]))
        img.header.set_xyzt_units("mm")
        nib.save(img, str(scan))
        times: dict = {side: {v: [] for v in VARIANTS} for side in ("before", "after")}
        for extra in VARIANTS.values():  # one untimed warm-up of each
            for side in ("before", "after"):
                run(getattr(a, side), scan, tmp / side, extra)
        for _ in range(a.rounds):
            for name, extra in VARIANTS.items():
                for side in ("before", "after"):
                    times[side][name].append(round(run(getattr(a, side), scan, tmp / side, extra), 3))
    med = {side: {v: statistics.median(t) for v, t in d.items()} for side, d in times.items()}
    commits = {side: commit_of(getattr(a, side) / "ctpore") for side in ("before", "after")}
    res = {"command": f"python scripts/speed_before_after.py {a.out} --before DIR --after DIR --rounds {a.rounds} "
                      f"--shape {a.shape}", "commits": commits, "cpu": cpu_name(),
           "shape": a.shape, "seconds": times, "median_seconds": med,
           "ratio_after_before": {v: round(med["after"][v] / med["before"][v], 4) for v in VARIANTS}}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res["ratio_after_before"]), res["cpu"])


if __name__ == "__main__":
    main()
