"""One OME-Zarr store written by several processes at once, a slab each: the same voxels, at every
level of the pyramid, as the store one process writes; never visible half-written; a rerun keeps
what an interrupted run wrote."""

from __future__ import annotations

import random
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("zarr")

from ctpore.data.io import geometry_from_array, load_scan  # noqa: E402
from ctpore.data.io.omezarr_split import SplitStore  # noqa: E402
from ctpore.data.io.omezarr_write import OmeZarrWriter  # noqa: E402


def volume(shape=(150, 300, 40), seed=0) -> np.ndarray:
    return np.random.default_rng(seed).random(shape, dtype=np.float32)


def levels(path: Path) -> list[np.ndarray]:
    import zarr

    group = zarr.open_group(str(path), mode="r")
    return [np.asarray(group[str(k)][:]) for k in range(len(list(group.array_keys())))]


def _write(store: SplitStore, z0: int, slab: np.ndarray) -> int:
    store.write(z0, slab)
    return z0


def test_slabs_written_by_two_processes_in_any_order_equal_one_processs_store(tmp_path):
    vol = volume()
    geometry = geometry_from_array(vol.shape, (0.02, 0.01, 0.01))
    with OmeZarrWriter(tmp_path / "one.ome.zarr", geometry, np.float32) as w:
        for a in range(0, len(vol), 7):
            w.write(vol[a:a + 7])
    store = SplitStore(tmp_path / "split.ome.zarr", geometry, np.float32, align=16)
    assert store.alignment == 16 and len(store.shapes) == 2  # a pyramid of two levels
    store.create()
    cuts = list(range(0, len(vol), 32)) + [len(vol)]  # slabs of 32 slices (2 x the alignment), the last shorter
    slabs = [(a, vol[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
    random.Random(0).shuffle(slabs)
    with ProcessPoolExecutor(2) as pool:
        assert sorted(pool.map(_write, [store] * len(slabs), *zip(*slabs))) == cuts[:-1]
    assert not store.path.exists()  # not before every slab is recorded
    store.finish()
    one, split = levels(tmp_path / "one.ome.zarr"), levels(store.path)
    assert len(one) == len(split) == 2
    for a, b in zip(one, split):
        assert np.array_equal(a, b)
    with load_scan(store.path) as scan:
        assert scan.geometry.spacing_mm == (0.02, 0.01, 0.01)
        assert np.array_equal(scan.read(), vol)
    assert not store.work.exists()


def test_a_rerun_keeps_the_slabs_an_interrupted_run_wrote(tmp_path):
    vol = volume((40, 16, 16))
    geometry = geometry_from_array(vol.shape, (1.0, 1.0, 1.0))
    first = SplitStore(tmp_path / "v.ome.zarr", geometry, np.float32, align=8)
    first.create()
    first.write(0, vol[:8])  # then the driver dies
    again = SplitStore(tmp_path / "v.ome.zarr", geometry, np.float32, align=8)
    again.create()
    for a in range(8, 40, 8):
        again.write(a, vol[a:a + 8])
    again.finish()
    with load_scan(tmp_path / "v.ome.zarr") as scan:
        assert np.array_equal(scan.read(), vol)
    other = SplitStore(tmp_path / "w.ome.zarr", geometry, np.uint8, align=8)
    other.create()
    other.write(0, np.ones((8, 16, 16), np.uint8))
    changed = SplitStore(tmp_path / "w.ome.zarr", geometry, np.float32, align=8)  # another type: made anew
    changed.create()
    changed.write(8, vol[8:])
    changed.write(0, vol[:8])
    changed.finish()
    with load_scan(tmp_path / "w.ome.zarr") as scan:
        assert np.array_equal(scan.read(), vol)


def test_a_slab_that_does_not_fit_the_volume_is_refused(tmp_path):
    store = SplitStore(tmp_path / "v.ome.zarr", geometry_from_array((16, 8, 8), (1.0, 1.0, 1.0)), np.uint8, align=8)
    store.create()
    with pytest.raises(ValueError, match="does not fit"):
        store.write(12, np.zeros((8, 8, 8), np.uint8))
    with pytest.raises(ValueError, match="power of two"):
        SplitStore(tmp_path / "v.ome.zarr", store.geometry, np.uint8, align=12)
