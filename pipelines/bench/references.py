"""What users run instead of ``ctpore reconstruct``, as whole processes, for ``ctpore bench speed``.

``python -m ctpore.pipelines.bench.references METHOD SCAN OUTDIR`` does what ``ctpore
reconstruct`` does (read the scan, normalize it, segment it, write the pores and the probability
map as NIfTI, measure the pores, write the metrics) with another method, through the same I/O and
metric functions, so that only the method differs:

``monai-unet``  MONAI's 3D U-Net as users set it up: ``UNet(3, 1, 1, channels=(16, 32, 64, 128),
                strides=(2, 2, 2), num_res_units=2)``, random weights (speed does not depend on
                them), ``sliding_window_inference`` with 96^3 windows and overlap 0.25, no_grad.

(The benchmark's trained U-Nets are methods of ``ctpore reconstruct`` itself: ``--method unet3d``.)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["REFERENCES", "run_reference"]

REFERENCES = ("monai-unet",)


def run_reference(method: str, scan: str | Path, outdir: str | Path) -> dict:
    """Segment ``scan`` with a reference method and write its outputs as ``ctpore reconstruct`` does."""
    import torch

    from ctpore.atomic import write_json_atomic
    from ctpore.data.io import load_scan, save_volume
    from ctpore.data.metrics import volume_metrics
    from ctpore.data.normalize import normalize_volume
    from ctpore.errors import InputError
    from ctpore.pipelines.outputs import check_outputs, output_set

    t0 = time.perf_counter()
    if method not in REFERENCES:
        raise InputError(f"unknown reference {method!r}; choose one of {', '.join(REFERENCES)}")
    paths = check_outputs(scan, outdir, overwrite=True)
    with load_scan(scan) as s:
        vol, geometry = s.read(), s.geometry
    from monai.inferers import sliding_window_inference
    from monai.networks.nets import UNet

    torch.manual_seed(0)
    net = UNet(3, 1, 1, channels=(16, 32, 64, 128), strides=(2, 2, 2), num_res_units=2).eval()
    with torch.no_grad():
        x = torch.from_numpy(normalize_volume(vol))[None, None]
        logits = sliding_window_inference(x, (96, 96, 96), 1, net, overlap=0.25)
        prob = torch.sigmoid(logits)[0, 0].numpy()
    pores = (prob >= 0.5).astype(np.uint8)
    metrics = volume_metrics(pores, geometry.spacing_mm)
    metrics.update(method=method, seconds=round(time.perf_counter() - t0, 3))
    with output_set(paths):
        save_volume(paths["pores"], pores, geometry, dtype=np.uint8)
        save_volume(paths["prob"], prob, geometry, dtype=np.float32)
        write_json_atomic(paths["metrics"], metrics)
    return metrics


if __name__ == "__main__":  # python -m ctpore.pipelines.bench.references METHOD SCAN OUTDIR
    if len(sys.argv) != 4:
        sys.exit(f"usage: python -m ctpore.pipelines.bench.references {{{','.join(REFERENCES)}}} SCAN OUTDIR")
    run_reference(*sys.argv[1:])
