"""Write tests/data/pinned_seeds.json: the pore family and a checksum of the label of every simulated
scan the benchmark, the further held-out scans and the shipped configs' validation use.

Run once, from the repository root, before the simulator changes: ``python scripts/pin_seeds.py``.
tests/test_synthetic_pins.py then checks that every one of these seeds still makes the same scan
(its label exactly, and its grey scan's mean and standard deviation to a part in a million: the
grey values' last bits can differ between CPUs, the label cannot), so a new family or scene never
moves an existing figure.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ctpore.data.splits import BENCH_SEED_BASE, FURTHER_SEED_BASE, POSTPROCESSING_SCANS, val_seed
from ctpore.data.synthetic import make_pair

#: (what, first seed, how many): the seeds `ctpore bench quality` and training's validation read.
GROUPS = (
    ("benchmark", BENCH_SEED_BASE, 8),
    ("further", FURTHER_SEED_BASE + 100, 40),
    ("validation", val_seed(1, 0), POSTPROCESSING_SCANS),
)
SIZE = 64


def label_digest(truth: np.ndarray) -> str:
    """sha256 of the label's bytes (uint8, C order), its first 16 hex digits."""
    return hashlib.sha256(np.ascontiguousarray(truth, np.uint8).tobytes()).hexdigest()[:16]


def main() -> None:
    pins = {"size": SIZE, "seeds": []}
    for what, start, n in GROUPS:
        for seed in range(start, start + n):
            scan, truth, info = make_pair(seed, shape=(SIZE,) * 3)
            pins["seeds"].append({"group": what, "seed": seed, "family": info["family"],
                                  "label_sha256_16": label_digest(truth),
                                  "scan_mean": float(scan.mean(dtype=np.float64)),
                                  "scan_std": float(scan.std(dtype=np.float64))})
    out = Path(__file__).resolve().parent.parent / "tests" / "data" / "pinned_seeds.json"
    out.write_text(json.dumps(pins, indent=1) + "\n")
    print(f"{len(pins['seeds'])} seeds pinned in {out}")


if __name__ == "__main__":
    main()
