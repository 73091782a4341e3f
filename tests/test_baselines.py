"""The classical pipelines against independent references."""

import numpy as np
import pytest
from scipy import ndimage
from skimage.filters import threshold_otsu

from ctpore.models.classical import clean_specks, otsu_segment


def _noisy_two_phase(seed=0, shape=(20, 24, 22), noise=0.08):
    rng = np.random.default_rng(seed)
    truth = ndimage.gaussian_filter(rng.standard_normal(shape), 2) > 0.05
    scan = np.where(truth, 0.3, 0.7) + rng.normal(0, noise, shape)
    return scan.astype(np.float32), truth


@pytest.mark.parametrize("chunk", [1, 5, 100])
def test_plain_otsu_matches_skimage_whatever_the_chunking(chunk):
    scan, _ = _noisy_two_phase()
    pores, t = otsu_segment(scan, chunk_slices=chunk)
    t_ref = threshold_otsu(scan, nbins=4096)
    # Binned thresholds differ by at most a couple of bins of width range/1024.
    assert abs(t - t_ref) <= 2 * (scan.max() - scan.min()) / 1024
    # Only voxels lying between the two thresholds can disagree.
    between = (scan > min(t, t_ref)) & (scan <= max(t, t_ref))
    np.testing.assert_array_equal(pores[~between], (scan <= t_ref)[~between])


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_streamed_median_equals_whole_volume_median(chunk):
    scan, _ = _noisy_two_phase(1)
    pores, t = otsu_segment(scan, median_size=3, chunk_slices=chunk)
    filt = ndimage.median_filter(scan, size=3, mode="nearest")
    np.testing.assert_array_equal(pores, (filt <= t).astype(np.uint8))


def test_filtered_pipeline_recovers_a_noisy_phase_better_than_plain():
    # Contrast-to-noise ratio 2 (0.4 / 0.2), as in a low-dose scan: the median filter pays off.
    scan, truth = _noisy_two_phase(2, noise=0.2)
    plain, _ = otsu_segment(scan)
    filt, _ = otsu_segment(scan, median_size=3, min_size=10)
    def err(p):
        return np.mean(p.astype(bool) != truth)
    assert err(filt) < err(plain)


def test_clean_specks_removes_exactly_the_small_components():
    p = np.zeros((12, 12, 12), np.uint8)
    p[1, 1, 1] = 1                      # 1-voxel pore speck: removed
    p[5:8, 5:8, 5:8] = 1                # 27-voxel pore: kept
    p[6, 6, 6] = 0                      # 1-voxel solid island inside it: filled
    p[10, 10, 10] = p[9, 9, 9] = 1      # 2 voxels touching at a corner (26-connected): size 2
    out = clean_specks(p, 3)
    assert out[1, 1, 1] == 0 and out[6, 6, 6] == 1
    assert out[10, 10, 10] == 0 and out[9, 9, 9] == 0
    assert out[5:8, 5:8, 5:8].all()
    out2 = clean_specks(p, 2)           # the corner pair (size 2) survives a threshold of 2
    assert out2[10, 10, 10] == 1 and out2[9, 9, 9] == 1


def test_constant_volume_is_all_solid():
    pores, _ = otsu_segment(np.full((4, 5, 6), 3.0, np.float32))
    assert pores.shape == (4, 5, 6) and pores.sum() == 0
