"""The heads a researcher reads: one colour scale with its bar, entropy against its maximum, rows
named by scale and window, the JSON's units, and the whole-scan summary (shape, sums, the same
numbers as the per-voxel view)."""

from __future__ import annotations

import json
import math

import nibabel as nib
import numpy as np
import pytest
import torch

from ctpore.pipelines.inspect import HeadView, attention_at, block_labels, entropy_stats
from ctpore.pipelines.inspect_plot import OUTSIDE_WINDOW, heatmap_image
from ctpore.pipelines.inspect_summary import head_summary
from helpers import run_cli

pytestmark = pytest.mark.usefixtures("one_thread")

LAYOUT = [{"name": "level2.0", "scale": 4, "window": 4, "n_heads": 2},
          {"name": "blocks.0", "scale": 1, "window": 2, "n_heads": 2}]


def two_blocks() -> HeadView:
    """Voxel z = 3 over slices 0..3: a 1/4-scale block (window 4) whose head 0 splits its attention
    over two slices (max 0.5) while head 1 puts it all on one (max 1.0); a full-resolution block
    with window 2."""
    w = np.array([[[0.0, 0.0, 0.5, 0.5], [0.0, 0.0, 0.0, 1.0]],
                  [[0.0, 0.0, 0.3, 0.7], [0.0, 0.0, 0.5, 0.5]]])
    return HeadView.from_weights((3, 5, 6), np.arange(4), w, LAYOUT)


def pixel(img, x, y) -> np.ndarray:
    return np.asarray(img)[int(y), int(x)].astype(int)


def cell(img, lay, row: int, slice_: int) -> np.ndarray:
    cw, ch = lay["cell"]
    col = lay["columns"].index(slice_)
    return pixel(img, lay["x0"] + col * cw + cw // 2, lay["rows"][row]["y"] + ch // 2)


def bar(img, lay, value: float) -> np.ndarray:
    cb = lay["colorbar"]
    f = (value - cb["vmin"]) / (cb["vmax"] - cb["vmin"])
    return pixel(img, cb["x0"] + round(f * (cb["x1"] - cb["x0"])), (cb["y0"] + cb["y1"]) / 2)


def close(a, b, tol=6) -> bool:
    return int(np.abs(np.asarray(a) - np.asarray(b)).max()) <= tol


def test_rows_with_different_maxima_share_one_colour_scale_shown_by_its_colour_bar():
    img, lay = heatmap_image(two_blocks())
    cb = lay["colorbar"]
    assert cb["vmin"] == 0 and cb["vmax"] == pytest.approx(1.0) and not lay["normalize_rows"]
    assert "one scale for all rows" in cb["label"]
    half, full = cell(img, lay, 0, 3), cell(img, lay, 1, 3)  # 0.5 in head 0, 1.0 in head 1
    assert close(half, bar(img, lay, 0.5)) and close(full, bar(img, lay, 1.0))
    assert np.abs(half - full).max() > 60  # not both drawn as "the row's maximum"
    assert close(cell(img, lay, 2, 3), bar(img, lay, 0.7)) and close(cell(img, lay, 2, 2), bar(img, lay, 0.3))
    assert close(bar(img, lay, 0.0), cell(img, lay, 0, 1))  # a zero weight inside the window: the bar's 0
    # the full-resolution block looks back 2 slices: slices 0 and 1 are outside its window (grey)
    assert close(cell(img, lay, 2, 0), OUTSIDE_WINDOW, 0) and close(cell(img, lay, 3, 1), OUTSIDE_WINDOW, 0)
    assert [r["label"] for r in lay["rows"]] == ["1/4 scale, head 0", "1/4 scale, head 1", "full resolution, head 0",
                                                 "full resolution, head 1"]
    assert lay["columns"] == [0, 1, 2, 3]


def test_rows_scaled_alone_only_when_asked_and_the_picture_says_so():
    img, lay = heatmap_image(two_blocks(), normalize_rows=True)
    assert lay["normalize_rows"] and "NOT comparable" in lay["colorbar"]["label"]
    assert close(cell(img, lay, 0, 3), cell(img, lay, 1, 3))  # each row's maximum: the same colour


def test_the_colour_scale_ends_near_the_largest_weight():
    w = np.full((1, 2, 4), 0.25)
    w[0, 1] = [0.1, 0.2, 0.3, 0.4]
    img, lay = heatmap_image(HeadView.from_weights((3, 0, 0), np.arange(4), w, LAYOUT[:1]))
    assert lay["colorbar"]["vmax"] == pytest.approx(0.4)
    assert close(cell(img, lay, 1, 3), bar(img, lay, 0.4)) and close(cell(img, lay, 0, 0), bar(img, lay, 0.25))


def test_entropy_is_in_nats_never_negative_and_a_fraction_of_its_window():
    # one-hot with rounding above 1: the entropy would be a tiny negative
    ent, norm, back = entropy_stats(np.array([[0.0, 1.0000001]]), np.array([1, 0]), 2)
    assert ent[0] == 0.0 and f"{ent[0]:.2f}" == "0.00" and norm[0] == 0.0 and back[0] == pytest.approx(0.0)
    ent, norm, back = entropy_stats(np.full((1, 4), 0.25), np.arange(3, -1, -1), 4)  # even over 4 slices
    assert ent[0] == pytest.approx(math.log(4)) and norm[0] == pytest.approx(1.0) and back[0] == pytest.approx(1.5)
    ent, norm, _ = entropy_stats(np.array([[0.0, 0.0, 0.5, 0.5]]), np.arange(3, -1, -1), 4)
    assert norm[0] == pytest.approx(math.log(2) / math.log(4))
    v = two_blocks()
    assert list(v.n_visible) == [4, 2] and v.max_entropy == pytest.approx([math.log(4), math.log(2)])
    assert v.normalized_entropy[1, 1] == pytest.approx(1.0)  # even over the 2 slices it can see
    assert v.lookback[0, 0] == pytest.approx(0.5) and v.lookback[1, 0] == pytest.approx(0.3)
    assert block_labels([{"scale": 8}, {"scale": 8}, {"scale": 1}]) == ["1/8 scale block 1", "1/8 scale block 2",
                                                                      "full resolution"]


# -- with a model ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from ctpore.models import PoreFormer, PoreFormerConfig
    from ctpore.models.weights import save_weights

    torch.manual_seed(0)
    cfg = PoreFormerConfig(d_model=16, n_heads=2, stem_channels=4, level_channels=(8, 16), level_attention=(0, 1),
                           level_window=6, window=4)
    d = tmp_path_factory.mktemp("tiny")
    return str(save_weights(PoreFormer(cfg).eval(), d / "tiny.safetensors", {"threshold": "0.5", "min_size": "4"}))


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    from ctpore.data.synthetic import make_pair

    vol, _truth, _ = make_pair(3, shape=(10, 24, 20))
    path = tmp_path_factory.mktemp("scan") / "rock.nii.gz"
    nib.save(nib.Nifti1Image(np.ascontiguousarray(vol.T), np.diag([0.02, 0.02, 0.02, 1.0])), path)
    return path, vol


def test_attention_json_states_units_windows_and_entropy_against_its_maximum(scan, tiny, capsys):
    path, _ = scan
    code, out, err = run_cli(["attention", path, "--at", "2,7,9", "--json", "--weights", tiny], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["units"]["entropy"] == "nats" and d["units"]["lookback"].startswith("slices")
    assert {"weights", "max_entropy", "normalized_entropy", "window", "top_slice"} <= set(d["units"])
    blocks = {b["label"]: b for b in d["blocks"]}
    assert set(blocks) == {"1/4 scale", "full resolution"}
    # the windows come from the model: level_window=6, window=4; at z = 2 each sees 3 slices
    assert blocks["1/4 scale"]["window"] == 6 and blocks["full resolution"]["window"] == 4
    for b in d["blocks"]:
        assert b["visible_slices"] == 3 and b["max_entropy"] == pytest.approx(math.log(3))
        for h in b["heads"]:
            w = np.array(h["weights"])
            ent = -(w[w > 0] * np.log(w[w > 0])).sum()
            assert h["entropy"] == pytest.approx(max(ent, 0.0), abs=1e-9)
            assert h["normalized_entropy"] == pytest.approx(h["entropy"] / math.log(3), abs=1e-9)
            assert h["lookback"] == pytest.approx(float((w * (2 - np.array(d["slices"]))).sum()), abs=1e-9)
            assert h["label"] == f"{b['label']}, head {h['head']}"
    code, out, _ = run_cli(["attention", path, "--at", "8,7,9", "--json", "--weights", tiny], capsys)
    d = json.loads(out)  # at z = 8 the windows bound what each head sees: 6 slices and 4
    assert [(b["visible_slices"], b["max_entropy"]) for b in d["blocks"]] == [
        (6, pytest.approx(math.log(6))), (4, pytest.approx(math.log(4)))]
    full = d["blocks"][1]["heads"][0]["weights"]
    assert len(full) > 4 and sum(full[:-4]) == 0  # nothing before its window
    code, out, _ = run_cli(["attention", path, "--at", "0,7,9", "--weights", tiny], capsys)
    assert code == 0 and "full resolution, head 1" in out and "-0.00" not in out
    assert "looks back 4 slices" in out and "1/4 scale, head 0" in out


def sampled(s: dict, shape) -> tuple[np.ndarray, np.ndarray]:
    stride, (oy, ox) = s["sample"]["stride"], s["sample"]["offset_yx"]
    return np.arange(oy, shape[1], stride), np.arange(ox, shape[2], stride)


def test_the_summary_has_a_histogram_per_head_that_counts_every_sampled_voxel(scan, tiny):
    path, vol = scan
    s = head_summary(path, weights=tiny, columns=30)
    ys, xs = sampled(s, vol.shape)
    n_vox = len(ys) * len(xs) * (vol.shape[0] - 1)  # every slice but the first of each sampled column
    assert s["sample"]["columns"] == len(ys) * len(xs) and 15 <= len(ys) * len(xs) <= 60
    assert s["sample"]["voxels"] == n_vox == s["sample"]["pore_voxels"] + s["sample"]["solid_voxels"]
    assert [h["label"] for h in s["heads"]] == ["1/4 scale, head 0", "1/4 scale, head 1", "full resolution, head 0",
                                                "full resolution, head 1"]
    assert [h["window"] for h in s["heads"]] == [6, 6, 4, 4]
    for h in s["heads"]:
        for key in ("lookback", "normalized_entropy"):
            hist = h[key]
            assert len(hist["pore"]) == len(hist["solid"]) == len(hist["bin_edges"]) - 1
            assert sum(hist["pore"]) == s["sample"]["pore_voxels"] and sum(hist["solid"]) == s["sample"]["solid_voxels"]
        assert h["lookback"]["bin_edges"][-1] == h["window"] - 1  # the farthest a head can look back
        assert h["normalized_entropy"]["bin_edges"][0] == 0 and h["normalized_entropy"]["bin_edges"][-1] == 1
    json.dumps(s)


def test_the_summary_equals_the_per_voxel_view_and_the_models_own_pores(scan, tiny):
    """Streamed in tiles and chunks with caches, the summary gives what attention_at gives voxel by
    voxel (a crop through the model in one pass), and its pore voxels are reconstruct's."""
    from ctpore.data.normalize import intensity_range, normalize
    from ctpore.models.weights import load_model
    from ctpore.pipelines.stream import predict

    path, vol = scan
    s = head_summary(path, weights=tiny, columns=4, chunk_slices=3, tile=8)
    ys, xs = sampled(s, vol.shape)
    back, norm = [], []
    for z in range(1, vol.shape[0]):
        for y in ys:
            for x in xs:
                v = attention_at(path, (z, int(y), int(x)), weights=tiny)
                back.append(v.lookback.ravel())
                norm.append(v.normalized_entropy.ravel())
    for i, h in enumerate(s["heads"]):
        assert h["lookback"]["mean"]["all"] == pytest.approx(np.mean([b[i] for b in back]), abs=2e-3)
        assert h["normalized_entropy"]["mean"]["all"] == pytest.approx(np.mean([n[i] for n in norm]), abs=2e-3)
    lo, hi = intensity_range(vol)
    prob = predict(load_model(tiny), normalize(vol.astype(np.float32), lo, hi), chunk_slices=4, tile=64)
    assert s["sample"]["pore_voxels"] == int((prob[1:][:, ys][:, :, xs] >= 0.5).sum())
    again = head_summary(path, weights=tiny, columns=4, chunk_slices=10, tile=64)  # other tiles, one chunk
    for a, b in zip(s["heads"], again["heads"]):
        assert a["lookback"]["mean"] == pytest.approx(b["lookback"]["mean"], abs=1e-4)


def test_summary_command_writes_the_picture_and_its_json(scan, tiny, tmp_path, capsys):
    from PIL import Image

    path, vol = scan
    pores = (vol < np.percentile(vol, 25)).astype(np.uint8)
    nib.save(nib.Nifti1Image(np.ascontiguousarray(pores.T), np.diag([0.02, 0.02, 0.02, 1.0])), tmp_path / "p.nii.gz")
    code, out, err = run_cli(["attention", path, "--summary", "-o", tmp_path / "heads.png", "--columns", "30",
                              "--pores", tmp_path / "p.nii.gz", "--weights", tiny], capsys)
    assert code == 0, err
    s = json.loads((tmp_path / "heads.json").read_text())
    assert s["command"].startswith("ctpore attention") and "--summary" in s["command"]
    assert "p.nii.gz" in s["pore_source"] and "full resolution, head 1" in out
    ys, xs = sampled(s, vol.shape)
    assert s["sample"]["pore_voxels"] == int(pores[1:][:, ys][:, :, xs].sum())
    png = np.asarray(Image.open(tmp_path / "heads.png"))
    assert png.ndim == 3 and png.shape[0] > 300 and png.std() > 10
    for bad, why in ((["--at", "1,2,3"], "without --at"), (["--pores", "p.nii.gz"], "with --summary"), ([], "--at")):
        args = ["attention", path, *bad, "--weights", tiny] + (["--summary"] if why == "without --at" else [])
        code, _, err = run_cli(args, capsys)
        assert code == 2 and why in err


def test_the_readme_says_what_the_shipped_heads_do_from_the_committed_summary():
    """The README's lines on the heads quote docs/heads_summary.json (written by the command in
    scripts/heads_summary.sh), and what they say holds in it."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    readme = " ".join((root / "README.md").read_text().split())  # line breaks are not the point
    s = json.loads((root / "docs" / "heads_summary.json").read_text())
    assert s["command"] in (root / "scripts" / "heads_summary.sh").read_text()
    assert "docs/heads_summary.png" in readme and (root / "docs" / "heads_summary.png").exists()

    def blocks(label):
        return [h for h in s["heads"] if h["block_label"] == label]

    def mean(h, key, cls):
        return h[key]["mean"][cls]

    def span(vals):
        return f"{min(vals):g}–{max(vals):g}"

    eighth, quarter, full = blocks("1/8 scale"), blocks("1/4 scale"), blocks("full resolution")
    assert {h["window"] for h in eighth + quarter} == {24} and {h["window"] for h in full} == {8}
    assert "look back 24 slices" in readme and "full-resolution block 8" in readme
    # 1/8 scale: almost even, pores and solid alike
    e8 = [mean(h, "normalized_entropy", c) for h in eighth for c in ("pore", "solid")]
    assert min(e8) > 0.9 and f"mean normalized entropy {span(e8)}" in readme
    assert all(abs(mean(h, "normalized_entropy", "pore") - mean(h, "normalized_entropy", "solid")) < 0.02
               for h in eighth)
    # 1/4 scale: the most selective head, which looks less far back in pores, and the two most even
    q = [mean(h, "normalized_entropy", "pore") for h in quarter]
    sel = q.index(min(q))
    even = sorted(range(len(q)), key=lambda i: -q[i])[:2]
    back = [mean(quarter[sel], "lookback", c) for c in ("pore", "solid")]
    assert back[0] < back[1]
    assert (f"head {sel} is the most selective of them and looks less far back in pores than in the solid "
            f"(mean look-back {back[0]:g} against {back[1]:g} slices)") in readme
    assert (f"heads {min(even)} and {max(even)} are the most even ({q[min(even)]:g} and {q[max(even)]:g} in pore "
            "voxels)") in readme
    # full resolution: concentrated near the voxel's own slice in pores, spread in the solid
    for h in full:
        assert mean(h, "normalized_entropy", "pore") < mean(h, "normalized_entropy", "solid")
        assert mean(h, "lookback", "pore") < mean(h, "lookback", "solid")
        assert int(np.argmax(h["lookback"]["pore"])) == 0  # the most common: within half a slice of its own
    said = (f"normalized entropy {span([mean(h, 'normalized_entropy', 'pore') for h in full])}, mean look-back "
            f"{span([mean(h, 'lookback', 'pore') for h in full])} slices), while in the solid it spreads out "
            f"({span([mean(h, 'normalized_entropy', 'solid') for h in full])}; "
            f"{span([mean(h, 'lookback', 'solid') for h in full])} slices)")
    assert said in readme
