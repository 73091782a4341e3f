"""The napari plugin: reader/writer, the work behind the widgets, and the widgets in a viewer.

The viewer tests need a display: pytest-xvfb gives one (Xvfb, as `.ci/run` installs it).
"""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest
import torch

napari = pytest.importorskip("napari")

from ctpore.app.napari import io as nio  # noqa: E402
from ctpore.app.napari.layers import (  # noqa: E402
    Cancelled,
    inspect_layers,
    reconstruct_layers,
    scan_layer,
    volume_of,
)
from ctpore.data.io import load_scan  # noqa: E402
from ctpore.errors import InputError  # noqa: E402


@pytest.fixture
def tiny_weights(tmp_path):
    from ctpore.models import PoreFormer, PoreFormerConfig
    from ctpore.models.weights import save_weights

    torch.manual_seed(0)
    model = PoreFormer(PoreFormerConfig(d_model=16, n_heads=2, stem_channels=4, level_channels=(8, 16),
                                        level_attention=(0, 1), level_window=6, window=4)).eval()
    return str(save_weights(model, tmp_path / "tiny.safetensors", {"threshold": "0.5", "min_size": "4"}))


@pytest.fixture
def scan_file(tmp_path):
    from ctpore.data.synthetic import make_pair

    scan, _truth, _ = make_pair(5, shape=(16, 40, 36))
    img = nib.Nifti1Image(np.ascontiguousarray(scan.T), np.diag([0.02, 0.02, 0.05, 1.0]))  # (x, y, z) mm
    img.header.set_xyzt_units("mm")
    nib.save(img, tmp_path / "rock.nii.gz")
    return tmp_path / "rock.nii.gz"


# -- without a viewer -------------------------------------------------------------------------


def test_reader_gives_the_scan_with_its_scale_and_name(scan_file):
    reader = nio.get_reader(str(scan_file))
    assert reader is not None
    [(data, kwargs, kind)] = reader(str(scan_file))
    with load_scan(scan_file) as s:
        np.testing.assert_array_equal(data, s.read())
    assert kind == "image" and kwargs["name"] == "rock"
    assert kwargs["scale"] == pytest.approx((0.05, 0.02, 0.02))  # (z, y, x): anisotropic voxels


def test_reader_returns_none_for_what_it_cannot_read(tmp_path, scan_file):
    (tmp_path / "notes.txt").write_text("not a scan")
    (tmp_path / "fake.nii").write_text("not a scan either")
    (tmp_path / "cut.nii.gz").write_bytes(scan_file.read_bytes()[:500])
    (tmp_path / "empty").mkdir()
    for p in ("notes.txt", "fake.nii", "cut.nii.gz", "empty", "missing.nii.gz"):
        assert nio.get_reader(str(tmp_path / p)) is None, p
    assert nio.get_reader([str(scan_file), str(scan_file)]) is None


@pytest.mark.parametrize("suffix", [".nii.gz", ".tif"])
def test_writer_round_trip_keeps_data_and_scale(tmp_path, scan_file, suffix):
    data, kwargs, _ = scan_layer(scan_file)
    pores = (data > np.median(data)).astype(np.uint8)
    [out] = nio.write_labels(str(tmp_path / f"pores{suffix}"), pores, kwargs)
    [(back, back_kw, _)] = nio.get_reader(out)(out)
    np.testing.assert_array_equal(back, pores)
    assert back_kw["scale"] == pytest.approx(kwargs["scale"], rel=1e-5)
    if suffix == ".nii.gz":  # the source header travels: same affine and units
        a, b = nib.load(scan_file), nib.load(out)
        np.testing.assert_array_equal(a.affine, b.affine)
        assert a.header.get_xyzt_units() == b.header.get_xyzt_units()
    [img] = nio.write_image(str(tmp_path / f"img{suffix}"), data, {"scale": (0.5, 0.25, 0.25)})
    [(back, back_kw, _)] = nio.get_reader(img)(img)
    np.testing.assert_allclose(back, data)
    assert back_kw["scale"] == pytest.approx((0.5, 0.25, 0.25), rel=1e-5)


def test_reconstruct_layers_have_the_scale_and_the_values_of_the_model(scan_file, tiny_weights):
    """The layers hold the network's own answer: one plain forward pass over the whole normalized
    scan (no tiles, no chunks, no pipeline), thresholded, with specks under 4 voxels removed (the
    weights' post-processing), at the scan's scale."""
    from ctpore.data.normalize import normalize_volume
    from ctpore.models.classical import clean_specks
    from ctpore.models.weights import load_model

    data, kwargs, _ = scan_layer(scan_file)
    layers, metrics = reconstruct_layers(data, "rock", kwargs["scale"], "poreformer", tiny_weights)
    (prob, pkw, pkind), (pores, lkw, lkind) = layers
    with torch.no_grad():
        x = torch.from_numpy(normalize_volume(np.asarray(data, np.float32)))[None]
        want = torch.sigmoid(load_model(tiny_weights)(x))[0].numpy()
    assert (pkind, lkind) == ("image", "labels")
    # the stored model exactly in fp32; on a CPU with native bf16 the default runs its bf16 copy
    tol = {"fp32": 1e-5, "bf16": 5e-3}[metrics["precision"]]
    np.testing.assert_allclose(prob, want, atol=tol)
    sure = np.abs(want - 0.5) > 10 * tol  # away from the threshold, where rounding cannot flip a voxel
    np.testing.assert_array_equal(pores[sure], clean_specks((want >= 0.5).astype(np.uint8), 4)[sure])
    assert pkw["scale"] == lkw["scale"] == pytest.approx(kwargs["scale"])
    assert metrics["porosity"] == pytest.approx(pores.mean()) and lkw["name"] == "rock pores"


def test_bad_layers_are_refused_with_a_reason_and_cancel_returns_nothing(tiny_weights):
    with pytest.raises(InputError, match="2D"):
        volume_of(np.zeros((20, 20)), "layer 'slice'")
    with pytest.raises(InputError, match="grayscale"):
        volume_of(np.array([["a"] * 3] * 3), "layer 'text'")
    calls = []
    with pytest.raises(Cancelled):
        reconstruct_layers(np.random.default_rng(0).random((12, 24, 24)), "r", None, "poreformer", tiny_weights,
                           progress=lambda *a: calls.append(a), should_stop=lambda: True)
    assert calls == []


def test_inspector_rows_sum_to_one_are_causal_and_per_head_layers_fit(scan_file, tiny_weights):
    data, kwargs, _ = scan_layer(scan_file)
    point = (12, 20, 17)
    layers, info = inspect_layers(data, point, kwargs["scale"], tiny_weights, radius=8)
    view = info["view"]
    np.testing.assert_allclose(view.weights.sum(-1), 1.0, atol=1e-5)  # every row a distribution
    assert view.slices[-1] == point[0]  # no later slice is even offered...
    later = view.to_dict()["slices"]
    assert max(later) == point[0]
    heads = [lay for lay in layers if lay[2] == "image"]
    assert len(heads) == 2  # one entropy layer per full-resolution head
    for ent, kw, _ in heads:  # entropy as a fraction of its maximum, in a small square on the point's slice
        assert ent.shape == (1, 17, 17) and np.all(ent >= 0) and np.all(ent <= 1 + 1e-6)
        assert kw["translate"][0] == pytest.approx(point[0] * kwargs["scale"][0])
        assert kw["metadata"]["ctpore_role"] == "entropy"
    assert [kw["visible"] for _, kw, _ in heads] == [True, False]  # the others hidden until asked
    points = {kw["name"]: data for data, kw, kind in layers if kind == "points"}
    np.testing.assert_array_equal(points["inspected voxel"], [point])  # a marker on the viewed slice
    top = points["most attended slices"]
    assert sorted(top[:, 0]) == sorted(set(view.top[-1])) and np.all(top[:, 0] <= point[0])
    assert 0 <= info["similarity"] <= 1
    json.dumps(view.to_dict())  # what `ctpore attention --json` prints


def test_attention_weights_are_exactly_zero_on_later_slices(tiny_weights):
    from ctpore.models.weights import load_model

    model = load_model(tiny_weights)
    x = torch.randn(1, 10, 24, 24)
    for w in model.attention_maps(x, region=(5, 7)):
        zq, zk = np.meshgrid(np.arange(10), np.arange(10), indexing="ij")
        assert np.all(w[0, 0, 0].numpy()[:, zk > zq] == 0)
        np.testing.assert_allclose(w[0, 0, 0].sum(-1).numpy(), 1.0, atol=1e-5)


# -- in a viewer -------------------------------------------------------------------------------


def test_reconstruct_widget_adds_layers_with_the_scale(make_napari_viewer, qtbot, scan_file, tiny_weights):
    from ctpore.app.napari.widgets import ReconstructWidget

    viewer = make_napari_viewer()
    viewer.open(str(scan_file), plugin="ctpore")
    widget = ReconstructWidget(viewer)
    widget.method.setCurrentText("poreformer")
    widget.weights.edit.setText(tiny_weights)
    widget.run()
    qtbot.waitUntil(lambda: widget.run_button.isEnabled(), timeout=120_000)
    assert widget.metrics is not None, widget.status.text()
    pores = viewer.layers["rock pores"]
    assert isinstance(pores, napari.layers.Labels)
    np.testing.assert_allclose(pores.scale, viewer.layers["rock"].scale)
    assert set(np.unique(pores.data)) <= {0, 1}
    assert "porosity" in widget.status.text()


def test_reconstruct_widget_says_what_is_wrong_and_cancel_adds_nothing(make_napari_viewer, qtbot, tiny_weights):
    from ctpore.app.napari.widgets import ReconstructWidget

    viewer = make_napari_viewer()
    viewer.add_image(np.random.default_rng(0).random((30, 30)), name="a slice")
    widget = ReconstructWidget(viewer)
    widget.run()
    qtbot.waitUntil(lambda: widget.run_button.isEnabled(), timeout=60_000)
    assert "2D" in widget.status.text() and len(viewer.layers) == 1
    viewer.add_image(np.random.default_rng(0).random((24, 48, 48)).astype(np.float32), name="vol")
    widget.layer_choice.setCurrentText("vol")
    widget.method.setCurrentText("poreformer")
    widget.weights.edit.setText(tiny_weights)
    widget.run()
    widget.cancel()
    qtbot.waitUntil(lambda: widget.run_button.isEnabled(), timeout=60_000)
    assert "cancelled" in widget.status.text() and [lay.name for lay in viewer.layers] == ["a slice", "vol"]


def test_a_click_fills_the_inspector(make_napari_viewer, qtbot, scan_file, tiny_weights):
    from types import SimpleNamespace

    from ctpore.app.napari.widgets import AttentionInspector

    viewer = make_napari_viewer()
    viewer.open(str(scan_file), plugin="ctpore")
    widget = AttentionInspector(viewer)
    widget.weights.edit.setText(tiny_weights)
    layer = viewer.layers["rock"]
    world = layer.data_to_world((12, 20, 17))
    widget._on_click(viewer, SimpleNamespace(type="mouse_press", position=tuple(world)))
    qtbot.waitUntil(lambda: widget.info is not None, timeout=120_000)
    assert widget.point() == (12, 20, 17)
    assert not widget.heatmap.pixmap().isNull()
    assert "head 0 attention entropy" in viewer.layers and "most attended slices" in viewer.layers
    assert "heads alike" in widget.summary.text()
    # the viewer shows the voxel's slice, and the voxel's marker is on it
    assert viewer.dims.current_step[0] == 12
    np.testing.assert_array_equal(viewer.layers["inspected voxel"].data, [[12, 20, 17]])
    # the entropy maps are small squares near the point, not the whole slice
    ent = viewer.layers["head 0 attention entropy"]
    assert ent.data.shape[1] * ent.data.shape[2] < 0.5 * layer.data.shape[1] * layer.data.shape[2]
    assert not viewer.layers["head 1 attention entropy"].visible
    # the dock's heatmap is the labelled picture (title, colour bar): far wider than one cell per slice
    assert widget.heatmap.pixmap().width() > 300
    assert viewer.dims.axis_labels == ("z", "y", "x")


def test_scan_lists_offer_only_scans(make_napari_viewer, qtbot, scan_file, tiny_weights):
    from types import SimpleNamespace

    from ctpore.app.napari.widgets import AttentionInspector, ReconstructWidget

    viewer = make_napari_viewer()
    viewer.open(str(scan_file), plugin="ctpore")
    rec, insp = ReconstructWidget(viewer), AttentionInspector(viewer)
    rec.method.setCurrentText("poreformer")
    rec.weights.edit.setText(tiny_weights)
    rec.run()
    qtbot.waitUntil(lambda: rec.run_button.isEnabled(), timeout=120_000)
    insp.weights.edit.setText(tiny_weights)
    insp._on_click(viewer, SimpleNamespace(type="mouse_press", position=tuple(viewer.layers["rock"].data_to_world(
        (12, 20, 17)))))
    qtbot.waitUntil(lambda: insp.info is not None, timeout=120_000)
    images = [lay.name for lay in viewer.layers if isinstance(lay, napari.layers.Image)]
    assert "rock pore probability" in images and "head 0 attention entropy" in images  # there, but not scans
    viewer.add_image(np.zeros((4, 8, 8), np.float32), name="another scan")  # a user's own image is a scan
    for combo in (rec.layer_choice, insp.layer_choice):
        assert [combo.itemText(i) for i in range(combo.count())] == ["rock", "another scan"]
    assert viewer.dims.axis_labels == ("z", "y", "x")


def test_the_summary_button_summarizes_the_scan_split_by_its_pores(make_napari_viewer, qtbot, scan_file,
                                                                    tiny_weights):
    from ctpore.app.napari.widgets import AttentionInspector

    viewer = make_napari_viewer()
    viewer.open(str(scan_file), plugin="ctpore")
    data = viewer.layers["rock"].data
    pores = (data < np.percentile(data, 30)).astype(np.uint8)
    viewer.add_labels(pores, name="rock pores", metadata={"ctpore_role": "pores", "ctpore_source": "rock"})
    widget = AttentionInspector(viewer)
    widget.weights.edit.setText(tiny_weights)
    widget.summarize()
    qtbot.waitUntil(lambda: widget.scan_summary is not None or "error" in widget.summary.text(), timeout=120_000)
    s = widget.scan_summary
    assert s is not None, widget.summary.text()
    assert "rock pores" in s["pore_source"] and not widget.scan_picture.pixmap().isNull()
    # pore voxels are those of the pores layer at the sampled columns (slices 1.., the grid of the sample)
    stride, (oy, ox) = s["sample"]["stride"], s["sample"]["offset_yx"]
    assert s["sample"]["pore_voxels"] == int(pores[1:, oy::stride, ox::stride].sum())


def test_the_pores_show_in_3d(make_napari_viewer, scan_file):
    """The viewer, shown under Xvfb, draws the pores layer in 3D: the canvas is not blank."""
    viewer = make_napari_viewer(show=True)
    data, kwargs, _ = scan_layer(scan_file)
    viewer.add_labels((data < np.percentile(data, 30)).astype(np.uint8), name="pores", scale=kwargs["scale"])
    viewer.dims.ndisplay = 3
    shot = viewer.screenshot(canvas_only=True, flash=False)
    rgb = shot[..., :3].astype(float)
    assert rgb.std() > 5 and (rgb.max(-1) > 40).mean() > 0.01  # drawn, not an empty black canvas


def test_attention_command_writes_the_heatmap_and_refuses_bad_coordinates(tmp_path, scan_file, tiny_weights,
                                                                         capsys):
    from PIL import Image

    from ctpore.app.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["attention", str(scan_file), "--at", "12,20,17", "-o", str(tmp_path / "heads.png"), "--json",
              "--weights", tiny_weights])
    assert exc.value.code == 0
    out = json.loads(capsys.readouterr().out)
    assert [b["name"] for b in out["blocks"]] == ["level2.0", "blocks.0"] and out["point"] == [12, 20, 17]
    png = np.asarray(Image.open(tmp_path / "heads.png"))
    assert png.ndim == 3 and png.std() > 10  # a drawn heatmap, not a blank image
    for at, why in (("16,20,17", "outside the scan"), ("1,2", "three integers"), ("a,b,c", "three integers")):
        with pytest.raises(SystemExit) as exc:
            main(["attention", str(scan_file), "--at", at, "--weights", tiny_weights])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0]


def test_the_found_sample_shows_by_its_outline_and_a_painted_mask_is_taken_as_the_sample(
        make_napari_viewer, qtbot, tiny_weights):
    """A core in a zero outside: the sample layer appears, drawn as its outline (contour); a 0/1
    layer the user paints is offered as the sample mask (the pores are not) and, picked, is the
    sample of the next run: no pore outside it, and it keeps a role of its own."""
    from ctpore.app.napari.layers import ROLE, SAMPLE_MASK_ROLE
    from ctpore.app.napari.widgets import ReconstructWidget
    from ctpore.data.synthetic import make_pair

    scan, _truth, _ = make_pair(5, shape=(12, 48, 48))
    _, yy, xx = np.indices(scan.shape)
    scan = scan.astype(np.float32)
    scan[(yy - 23.5) ** 2 + (xx - 23.5) ** 2 > 20 ** 2] = 0
    viewer = make_napari_viewer()
    viewer.add_image(scan, name="core")
    widget = ReconstructWidget(viewer)
    widget.method.setCurrentText("poreformer")
    widget.weights.edit.setText(tiny_weights)
    widget.run()
    qtbot.waitUntil(lambda: widget.run_button.isEnabled(), timeout=120_000)
    sample = viewer.layers["core sample"]
    assert sample.visible and sample.contour > 0 and sample.metadata[ROLE] == "sample"
    assert "left out" in widget.status.text()
    painted = np.zeros(scan.shape, np.uint8)
    painted[:, 10:30, 12:34] = 1
    viewer.add_labels(painted, name="my mask")
    items = [widget.sample_choice.itemText(i) for i in range(widget.sample_choice.count())]
    assert "my mask" in items and "core sample" in items and "core pores" not in items
    widget.sample_choice.setCurrentText("my mask")
    widget.run()
    qtbot.waitUntil(lambda: widget.run_button.isEnabled(), timeout=120_000)
    assert widget.metrics["sample"]["mode"] == "mask", widget.status.text()
    assert widget.metrics["sample_voxels"] == int(painted.sum())
    pores = [layer for layer in viewer.layers if layer.metadata.get(ROLE) == "pores"][-1].data  # the second run's
    assert not np.any((np.asarray(pores) > 0) & (painted == 0))
    assert viewer.layers["my mask"].metadata[ROLE] == SAMPLE_MASK_ROLE


def test_paint_fine_tune_and_reconstruct_with_the_tuned_weights(make_napari_viewer, qtbot, scan_file, tmp_path):
    """The loop in the viewer: a labels layer in pore and solid colours, three slices painted, a few
    steps of tuning in the worker, the tuned weights written and the scan reconstructed with them;
    then "Label next" marks the slice where the tuned model is least sure."""
    from ctpore.app.napari.finetune_dock import FineTuneWidget
    from ctpore.app.napari.tuning import LABELS_ROLE

    viewer = make_napari_viewer()
    viewer.open(str(scan_file), plugin="ctpore")
    widget = FineTuneWidget(viewer)
    widget.add_labels()
    labels = viewer.layers["rock labels"]
    assert labels.metadata["ctpore_role"] == LABELS_ROLE and widget.labels_choice.currentText() == "rock labels"
    assert list(labels.features["class"]) == ["not labelled", "pore", "solid"]
    scan = np.asarray(viewer.layers["rock"].data)
    for z in (3, 8, 13):  # painted: the darker half pore, the rest solid
        labels.data[z] = np.where(scan[z] < np.median(scan[z]), 1, 2)
    widget.steps.setValue(3)
    widget.out.setText(str(tmp_path / "tuned.safetensors"))
    widget.run()
    qtbot.waitUntil(lambda: widget.run_button.isEnabled(), timeout=300_000)
    assert widget.report is not None, widget.status.text()
    assert (tmp_path / "tuned.safetensors").is_file() and "tuned: MSE" in widget.status.text()
    pores = viewer.layers["rock (tuned) pores"]
    assert "fine-tuned" in pores.metadata["ctpore_metrics"]["model"]["name"]
    widget.mark_next()
    assert "label next" in viewer.layers and viewer.dims.current_step[0] == int(viewer.layers["label next"].data[0][0])


def test_analyze_a_pores_layer_within_its_sample(make_napari_viewer, qtbot):
    """The Analyze dock: a pores layer and its sample picked, the worker run; the thickness map comes
    back as a layer equal to analyze's own, the pore-size plot is drawn, the figures are written."""
    from scipy import ndimage as ndi

    from ctpore.app.napari.analysis_dock import AnalyzeWidget
    from ctpore.data.io.geometry import geometry_from_array
    from ctpore.pipelines.analysis import analyze_volume

    rng = np.random.default_rng(3)
    pores = (ndi.gaussian_filter(rng.random((24, 40, 40)), 2.0) > 0.5).astype(np.uint8)
    z, y, x = np.indices(pores.shape)
    sample = ((y - 19.5) ** 2 + (x - 19.5) ** 2 < 18**2).astype(np.uint8)
    viewer = make_napari_viewer()
    viewer.add_labels(pores, name="rock pores", scale=(0.01, 0.01, 0.01), metadata={"ctpore_role": "pores"})
    viewer.add_labels(sample, name="rock sample", scale=(0.01, 0.01, 0.01), metadata={"ctpore_role": "sample"})
    widget = AnalyzeWidget(viewer)
    assert widget.pores_choice.currentText() == "rock pores" and widget.sample_choice.currentText() == "rock sample"
    widget.run()
    qtbot.waitUntil(lambda: widget.run_button.isEnabled(), timeout=120_000)
    assert widget.result is not None, widget.status.text()
    want = analyze_volume(pores, geometry_from_array(pores.shape, (0.01, 0.01, 0.01)), sample=sample > 0)
    assert widget.result["connected_porosity"] == want["connected_porosity"]
    layer = viewer.layers["rock pores thickness (mm)"]
    assert layer.metadata["ctpore_role"] == "thickness" and float(np.asarray(layer.data).max()) > 0
    assert np.asarray(layer.data)[sample == 0].max() == 0  # outside the sample: no pore, no thickness
    assert widget.picture.pixmap() is not None and not widget.picture.pixmap().isNull()
    assert "percolating z, y, x" in widget.status.text()
