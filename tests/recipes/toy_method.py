"""A toy method, added the documented way: one module, one registration line.

It calls a voxel pore where the normalized grey value is below 0.3 (a fixed threshold), as a
probability of 1 or 0.
"""

from __future__ import annotations

from ctpore.data.postprocess import Postprocessing
from ctpore.pipelines.methods import MethodSpec, Untiled, register_method


class DarkerThan(Untiled):  # no tiles, no plan: halo and plan() are None
    name = "toy-dark"

    def __init__(self, weights=None, device="cpu", attention_backend=None):
        self.post = Postprocessing(threshold=0.5)
        self.info = {"model": {"name": "toy-dark", "sha256": None}, "device": "cpu", "attention_backend": None}

    def predict(self, volume, out, *, budget_bytes, progress=None, chunk_slices=None, tile=None, precision="auto"):
        nz, ny, nx = volume.shape
        for z0 in range(0, nz, 4):
            z1 = min(nz, z0 + 4)
            out[z0:z1, 0:ny, 0:nx] = (volume[z0:z1] < 0.3).astype("float32")
        return {}


register_method(MethodSpec("toy-dark", "Toy", "normalized grey value below 0.3", DarkerThan))
