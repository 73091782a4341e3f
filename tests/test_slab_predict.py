"""One slab of a scan, computed alone: the model's reach along Z, and the same bytes as the whole run.

A scan split across processes computes each Z-slab from a warm-up of earlier slices. Two things
make that exact: the warm-up covers everything a slab's outputs depend on (the model's reach, a
property checked here by changing one slice and seeing how far the change travels), and every sum
runs over the same terms in the same order as in the whole run (checked by comparing bytes).
"""

from __future__ import annotations

import numpy as np
import pytest

from ctpore.errors import InputError
from ctpore.models import PoreFormer, PoreFormerConfig
from ctpore.models.weights import load_for_inference
from ctpore.pipelines.stream import predict
from ctpore.pipelines.stream_plan import warm_up

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def tiny(**kw) -> PoreFormer:
    """Head size 16 (the window kernel's), attention at 1/4 (window 5) and full resolution (window 3)."""
    import torch

    torch.manual_seed(0)
    base = dict(d_model=32, n_heads=2, n_kv_heads=1, n_layers=1, window=3, stem_channels=4,
                level_channels=(8, 32), level_attention=(0, 1), level_window=5)
    base.update(kw)
    return PoreFormer(PoreFormerConfig(**base)).eval()


def volume(z, y=16, x=16, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((z, y, x), dtype=np.float32)


@pytest.mark.parametrize("shipped", [False, True], ids=["tiny", "shipped"])
def test_a_change_in_one_slice_reaches_exactly_z_reach_slices_further(shipped):
    model = load_for_inference(None, "cpu", None)[0] if shipped else tiny()
    reach = model.z_reach
    j = 5
    vol = volume(j + reach + 12)
    base = predict(model, vol, chunk_slices=vol.shape[0], tile=16, precision="fp32")
    changed = vol.copy()
    changed[j] += 3.0
    out = predict(model, changed, chunk_slices=vol.shape[0], tile=16, precision="fp32")
    assert np.array_equal(out[:j], base[:j])  # causal
    assert not np.array_equal(out[j + reach], base[j + reach])  # still felt at the reach
    assert np.array_equal(out[j + reach + 1:], base[j + reach + 1:])  # never beyond it


def test_the_reach_is_unbounded_where_a_block_sees_every_earlier_slice():
    assert PoreFormerConfig(window=None).z_reach is None
    assert PoreFormerConfig(level_window=None).z_reach is None
    assert warm_up(tiny(window=None)) is None


@pytest.mark.parametrize("kernel", [True, False], ids=["window-kernel", "pytorch-attention"])
@pytest.mark.parametrize("precision", ["fp32", "auto"])
def test_a_slab_computed_alone_holds_the_whole_runs_bytes(kernel, precision, request):
    if not kernel:
        request.getfixturevalue("no_window_kernel")
    model = load_for_inference(None, "cpu", None)[0]
    vol = volume(150, 40, 48)
    whole = predict(model, vol, chunk_slices=16, tile=24, precision=precision)  # several tiles
    for za, zb in ((0, 32), (32, 80), (80, 150), (70, 71), (100, 149)):
        part = predict(model, vol, chunk_slices=16, tile=24, precision=precision, z_range=(za, zb))
        assert part.shape == (zb - za, 40, 48)
        assert np.array_equal(part, whole[za:zb]), (za, zb)


def test_without_the_window_kernel_the_warm_up_adds_the_largest_window(no_window_kernel):
    model = tiny()
    assert warm_up(model) == model.z_reach + 4  # every cache as full as in the whole run: window 5 less one


def test_with_the_window_kernel_the_warm_up_is_the_reach():
    from ctpore.models import window_kernel

    if not window_kernel.available():
        pytest.skip("the window kernel is not built here (no C compiler at install)")
    model = tiny()
    assert warm_up(model) == model.z_reach
    assert warm_up(tiny(attention_backend="math")) == model.z_reach + 4  # the reference kernel sums it all


def test_a_slab_starts_its_work_no_earlier_than_its_warm_up_needs():
    """The work a slab does: its own chunks and those that hold its warm-up, not the scan's start."""
    model = tiny()
    vol = volume(64)
    seen = []
    predict(model, vol, chunk_slices=8, tile=16, precision="fp32", z_range=(40, 48),
            progress=lambda done, total, what: seen.append(total))
    early = warm_up(model)
    assert seen[-1] == len(range((40 - early) // 8 * 8, 48, 8))  # one tile: the chunks from the warm-up on


def test_a_bad_z_range_is_one_clear_error():
    model = tiny()
    for bad in ((5, 5), (-1, 3), (0, 99), ("a", 2)):
        with pytest.raises(InputError, match="z_range"):
            predict(model, volume(10), chunk_slices=4, tile=16, z_range=bad)
    with pytest.raises(InputError, match="slices 2:6"):
        predict(model, volume(10), chunk_slices=4, tile=16, z_range=(2, 6), out=np.zeros((10, 16, 16), np.float32))
