"""Every simulated scan a published figure rests on stays the same scan: the benchmark's, the further
held-out scans' and the shipped configs' validation seeds keep their pore family, their label and
their grey scan (pinned by ``scripts/pin_seeds.py``; the labels before the simulator learned
scenes, the grey statistics after, checked equal to the simulator before scenes on every seed). A
new family, scene or random draw must take a stream of its own, never one of these seeds'. The
label is compared exactly, the grey scan by its mean and standard deviation to a part in a million:
its last bits may differ between CPUs (SIMD maths), a 0/1 label cannot."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from ctpore.data.splits import BENCH_SEED_BASE, FURTHER_SEED_BASE, val_seed
from ctpore.data.synthetic import make_pair

PINS = json.loads((Path(__file__).parent / "data" / "pinned_seeds.json").read_text())


def test_the_pins_cover_the_benchmark_further_and_validation_seeds():
    seeds = {e["seed"] for e in PINS["seeds"]}
    assert set(range(BENCH_SEED_BASE, BENCH_SEED_BASE + 8)) <= seeds
    assert set(range(FURTHER_SEED_BASE + 100, FURTHER_SEED_BASE + 140)) <= seeds
    assert set(range(val_seed(1, 0), val_seed(1, 48))) <= seeds


@pytest.mark.parametrize("group", ["benchmark", "further", "validation"])
def test_every_pinned_seed_makes_the_same_family_and_label(group):
    size = PINS["size"]
    changed = []
    for e in (e for e in PINS["seeds"] if e["group"] == group):
        scan, truth, info = make_pair(e["seed"], shape=(size,) * 3)
        digest = hashlib.sha256(np.ascontiguousarray(truth, np.uint8).tobytes()).hexdigest()[:16]
        grey = (scan.mean(dtype=np.float64), scan.std(dtype=np.float64))
        if info["family"] != e["family"] or digest != e["label_sha256_16"] or not np.allclose(
                grey, (e["scan_mean"], e["scan_std"]), rtol=1e-6, atol=0):
            changed.append((e["seed"], e["family"], info["family"]))
    assert not changed, f"these seeds no longer make their pinned scan: {changed}"
