"""Streaming inference: chunks + KV cache + tiles with halo equal the full pass; memory bounded."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from ctpore.errors import InputError
from ctpore.models import PoreFormer, PoreFormerConfig
from ctpore.pipelines import predict as _predict
from ctpore.pipelines.stream_plan import plan_tiles

# Streaming is exact for the stored (fp32) model; the bf16 copy that precision="auto" runs on CPUs
# with native bf16 is compared with it in test_window_kernel.py.
predict = functools.partial(_predict, precision="fp32")

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def small(**kw) -> PoreFormerConfig:
    """Head size 8; levels at 1/2 and 1/4 (attention at 1/4): align 4, halo 20."""
    base = dict(d_model=32, n_heads=4, n_kv_heads=None, n_layers=2, window=None, stem_channels=4,
                level_channels=(8, 32), level_attention=(0, 1), level_window=None)
    base.update(kw)
    return PoreFormerConfig(**base)


def volume(z=12, y=20, x=20, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((z, y, x), dtype=np.float32)


def full_pass(model: PoreFormer, vol: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return torch.sigmoid(model.eval()(torch.from_numpy(vol)[None]))[0].numpy()


class LazyVolume:
    """A scan read slice-range by slice-range, as a lazy on-disk reader would be."""

    def __init__(self, arr: np.ndarray):
        self.arr, self.shape, self.reads = arr, arr.shape, 0

    def __getitem__(self, key):
        assert isinstance(key, slice)  # predict only asks for slice ranges
        self.reads += 1
        return self.arr[key].copy()


@pytest.mark.parametrize(
    "cfg_kw",
    [
        {},
        {"window": 3},
        {"n_kv_heads": 1},
        {"window": 4, "n_kv_heads": 2},
        {"window": 5, "level_window": 3, "attention_backend": "math"},
    ],
    ids=["full", "window3", "mqa", "window4-gqa2", "window5-math"],
)
@pytest.mark.parametrize("chunk", [1, 7, 12])
def test_stream_equals_full_pass(cfg_kw, chunk):
    torch.manual_seed(0)
    model = PoreFormer(small(**cfg_kw))
    vol = volume(12, 20, 17)
    want = full_pass(model, vol)
    got = predict(model, vol, chunk_slices=chunk, tile=8)  # 3 x 3 tiles, halo 20 (clipped)
    assert got.dtype == np.float32 and got.shape == vol.shape
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "cfg_kw, tile",
    [
        ({"window": 4}, 8),
        ({"level_channels": (4,), "level_attention": (1,), "level_dilation": 3}, 7),
        ({"level_channels": (4, 8, 8), "level_attention": (1, 0, 1), "n_kv_heads": 1}, 10),
    ],
    ids=["two-levels", "one-level-odd-tile", "three-levels"],
)
def test_stream_with_interior_tiles_equals_full_pass(cfg_kw, tile):
    """Tiles far from the plane's edges (context-only margins) and odd plane sizes stitch exactly."""
    torch.manual_seed(0)
    model = PoreFormer(small(**cfg_kw))
    assert model.halo % model.align == 0 and model.halo >= model.token_halo
    vol = volume(6, 75, 70) if model.halo < 20 else volume(6, 160, 150)  # interior windows
    tiles = plan_tiles(vol.shape[1], vol.shape[2], -(-tile // model.align) * model.align, model.halo)
    assert any(w[0] > 0 and w[1] < vol.shape[1] for _c, w in tiles)  # some windows are interior
    want = full_pass(model, vol)
    got = predict(model, vol, chunk_slices=4, tile=tile)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_coarse_levels_reach_far_in_plane():
    """A pixel's logit changes when a pixel beyond the full-resolution convs' reach changes, and
    not beyond the stated halo."""
    torch.manual_seed(0)
    cfg = small()
    model = PoreFormer(cfg).eval()
    vol = torch.from_numpy(volume(3, 96, 96))[None]
    far = cfg.halo // 2  # far beyond the stem's 1 pixel: through the coarse levels
    with torch.no_grad():
        base = model(vol)[0, -1, 48, 48]
        v2 = vol.clone()
        v2[0, :, 48, 48 + far] += 5.0
        assert abs(float(model(v2)[0, -1, 48, 48] - base)) > 1e-6
        v3 = vol.clone()
        v3[0, :, 48, 48 + model.halo + 1] += 5.0  # outside the halo: no effect at all
        assert float(model(v3)[0, -1, 48, 48] - base) == 0.0


def test_lazy_volume_memmap_out_and_progress(tmp_path):
    torch.manual_seed(1)
    model = PoreFormer(small(window=4))
    vol = volume(10, 14, 14)
    lazy = LazyVolume(vol)
    out = np.lib.format.open_memmap(tmp_path / "prob.npy", mode="w+", dtype=np.float32,
                                    shape=vol.shape)
    calls = []
    res = predict(model, lazy, chunk_slices=4, tile=10, out=out,
                  progress=lambda d, t, s: calls.append((d, t, s)))
    assert res is out
    n_tiles, n_chunks = 4, 3
    assert lazy.reads == n_tiles * n_chunks  # tiles outermost: one pass over z per tile
    assert [c[0] for c in calls] == list(range(1, n_tiles * n_chunks + 1))
    assert {c[1] for c in calls} == {n_tiles * n_chunks} and calls[0][2] == "predict"
    out.flush()
    np.testing.assert_allclose(np.load(tmp_path / "prob.npy"), full_pass(model, vol),
                               atol=1e-5, rtol=0)


def test_predict_uses_eval_mode_and_restores_it():
    torch.manual_seed(0)
    model = PoreFormer(small(dropout=0.5)).train()
    vol = volume(6, 9, 9)
    a = predict(model, vol, chunk_slices=2, tile=9)
    assert model.training  # restored
    b = predict(model, vol, chunk_slices=3, tile=5)
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)  # no dropout in inference
    np.testing.assert_allclose(a, full_pass(model, vol), atol=1e-5, rtol=0)


def test_plan_tiles_cover_once_with_halo():
    for h, w, tile, halo in [(20, 17, 8, 3), (5, 5, 8, 2), (64, 64, 64, 4), (9, 30, 4, 0)]:
        cover = np.zeros((h, w), int)
        for (y0, y1, x0, x1), (wy0, wy1, wx0, wx1) in plan_tiles(h, w, tile, halo):
            cover[y0:y1, x0:x1] += 1
            assert y1 - y0 <= tile and x1 - x0 <= tile
            assert wy0 == max(0, y0 - halo) and wy1 == min(h, y1 + halo)
            assert wx0 == max(0, x0 - halo) and wx1 == min(w, x1 + halo)
        assert np.all(cover == 1)


def test_bad_inputs_raise_input_error():
    model = PoreFormer(small())
    with pytest.raises(InputError, match=r"\(Z, Y, X\).*\(4, 5\)"):
        predict(model, np.zeros((4, 5), np.float32))
    with pytest.raises(InputError, match="out must have the volume's shape"):
        predict(model, volume(4, 5, 6), out=np.zeros((4, 5, 5), np.float32))
    with pytest.raises(InputError, match="chunk_slices must be an integer >= 1, got 0"):
        predict(model, volume(4, 5, 6), chunk_slices=0)
    bad = volume(4, 5, 6)
    bad[2, 1, 1] = np.nan
    with pytest.raises(InputError, match="non-finite"):
        predict(model, bad)


_CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import torch
    from ctpore.models import PoreFormer, PoreFormerConfig
    from ctpore.pipelines import predict

    def status(key):
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise KeyError(key)

    class Lazy:  # slices made on demand: the input never exists whole
        def __init__(self, z):
            self.shape = (z, 64, 64)
        def __getitem__(self, s):
            return np.random.default_rng(s.start).standard_normal(
                (s.stop - s.start, 64, 64), dtype=np.float32)

    class Sink:  # output consumed on arrival: it never exists whole either
        def __init__(self, z):
            self.shape, self.n, self.ok = (z, 64, 64), 0, True
        def __setitem__(self, key, val):
            self.n += val.size
            self.ok &= bool(np.all((val >= 0) & (val <= 1)))

    z, window = int(sys.argv[1]), (None if sys.argv[2] == "None" else int(sys.argv[2]))
    torch.manual_seed(0)
    model = PoreFormer(PoreFormerConfig(d_model=8, n_heads=1, n_layers=1, window=window,
                                        stem_channels=4, level_channels=(4,), level_attention=(0,)))
    predict(model, Lazy(64), chunk_slices=32, tile=64, out=Sink(64), precision="fp32")  # warm-up
    base = status("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset the peak RSS to the current RSS
    except OSError:
        pass  # then the peak includes the (smaller) warm-up: still a fair upper bound
    sink = Sink(z)
    predict(model, Lazy(z), chunk_slices=32, tile=64, out=sink, precision="fp32")  # 4-byte caches
    print(json.dumps({"increase": status("VmHWM") - base, "written": sink.n, "ok": sink.ok}))
    """
)


def _peak_increases(tmp_path, runs: list[tuple[int, int | None]]) -> list[dict]:
    """Run predict in fresh processes, two at a time; each reports its peak RSS increase."""
    script = tmp_path / "mem_child.py"
    script.write_text(_CHILD)
    # A fixed mmap threshold makes glibc return every freed block >= 64 KiB to the system at
    # once, so RSS follows live memory instead of the allocator's caching and fragmentation.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    pending = list(enumerate(runs))
    running: list[tuple[int, subprocess.Popen]] = []
    results: dict[int, dict] = {}
    while pending or running:
        while pending and len(running) < 2:
            i, (z, w) = pending.pop(0)
            running.append((i, subprocess.Popen(
                [sys.executable, str(script), str(z), str(w)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)))
        i, p = running.pop(0)
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        r = json.loads(out.strip().splitlines()[-1])
        assert r["written"] == runs[i][0] * 64 * 64 and r["ok"]  # every voxel, in [0, 1]
        results[i] = r
    return [results[i] for i in range(len(runs))]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_peak_memory_does_not_grow_with_z(tmp_path):
    # The longest runs first, so the two workers finish together.
    long_, full_long, short, full_short = _peak_increases(
        tmp_path, [(2048, 16), (384, None), (256, 16), (128, None)]
    )
    assert short["increase"] > 0
    # Windowed model: 8x more slices, (almost) the same peak.
    assert long_["increase"] <= 1.2 * short["increase"], (short, long_)
    # Control: the measurement does see growth. Without a window the cache keeps every slice
    # (64 B per pixel and slice here: +67 MB for 256 more slices of 64 x 64).
    assert full_long["increase"] >= full_short["increase"] + 50e6, (full_short, full_long)


def test_bilinear_upsampling_of_a_crop_equals_the_crop_of_the_upsampling():
    from ctpore.models.blocks import up2 as _up2

    h = torch.randn(2, 3, 11, 13)
    full = torch.nn.functional.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False)
    for rows, cols in [((0, 22), (0, 26)), ((5, 17), (3, 20)), ((1, 2), (25, 26)), ((20, 22), (0, 5))]:
        torch.testing.assert_close(_up2(h, rows, cols, (22, 26)), full[..., rows[0]:rows[1], cols[0]:cols[1]])


def test_plan_fits_the_budget_and_prefers_whole_planes():
    from ctpore.pipelines.stream_plan import plan_streaming

    model = PoreFormer(PoreFormerConfig())
    for shape in ((96, 256, 256), (8, 1024, 1024), (2000, 2048, 2048)):
        for gb in (0.5, 1.0, 4.0):
            tile, chunk = plan_streaming(model, shape, gb * 2**30)
            window = min(shape[1], tile + 2 * model.halo), min(shape[2], tile + 2 * model.halo)
            assert model.inference_bytes(window, (min(tile, shape[1]), min(tile, shape[2])), chunk) <= gb * 2**30
            assert tile % model.align == 0 and 1 <= chunk <= shape[0]
    assert plan_streaming(model, (96, 256, 256), 4 * 2**30)[0] == 256  # the whole plane is one tile
    small = plan_streaming(model, (96, 1024, 1024), 0.5 * 2**30)
    large = plan_streaming(model, (96, 1024, 1024), 4 * 2**30)
    assert small[0] * small[1] < large[0] * large[1]  # more memory, bigger pieces
    with pytest.raises(InputError, match="raise --memory-gb"):
        plan_streaming(model, (96, 1024, 1024), 1e6)

