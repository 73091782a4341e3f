"""``python scripts/window_cache_ab.py SCAN.nii.gz [PAIRS]``: PoreFormer's streamed fp32 prediction of
a scan with the window kernel reading the KV caches in place (as ctpore runs it) and with the cached
keys and values joined to the chunk's by a copy first (as before), alternating, in one process; prints
each run's seconds, the medians, and whether the two gave the same bytes."""

from __future__ import annotations

import statistics
import sys
import time

import nibabel as nib
import numpy as np
import torch

import ctpore.models.attention as attention
from ctpore.data.normalize import normalize
from ctpore.pipelines.methods.learned import PoreFormerPredictor
from ctpore.pipelines.stream import predict
from ctpore.runtime import tune_allocator


def main() -> None:
    tune_allocator()
    scan, pairs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4
    p = PoreFormerPredictor(None, "cpu", None)
    vol = np.asarray(nib.load(scan).dataobj).T.astype(np.float32)
    lo, hi = np.percentile(vol, [0.5, 99.5])
    v = normalize(vol, lo, hi)
    tile, chunk = p.plan(v.shape, 1.0e9, precision="fp32")
    in_place = attention.attend

    def joined(backend, q, k, vv, pp, causal, window, nw, rm, past=None):
        if past is not None:
            k, vv = torch.cat([past[0], k], 1), torch.cat([past[1], vv], 1)
        return in_place(backend, q, k, vv, pp, causal, window, nw, rm)

    times, outs = {"in place": [], "joined": []}, {}
    for _ in range(pairs):
        for mode, fn in (("in place", in_place), ("joined", joined)):
            attention.attend = fn
            out = np.empty(v.shape, np.float32)
            t = time.perf_counter()
            predict(p.model, v, chunk_slices=chunk, tile=tile, out=out, precision="fp32")
            times[mode].append(time.perf_counter() - t)
            outs[mode] = out
            print(mode, round(times[mode][-1], 3), flush=True)
    attention.attend = in_place
    print({m: round(statistics.median(t), 3) for m, t in times.items()}, "same bytes:",
          bool(np.array_equal(outs["in place"], outs["joined"])))


if __name__ == "__main__":
    main()
