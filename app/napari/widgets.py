"""The two dock widgets: Reconstruct pores, and the Attention inspector (Qt, through qtpy).

Both run their work in a napari ``thread_worker`` so the viewer stays responsive, and say what
went wrong in the dock (one line, no traceback). The work itself is in
:mod:`ctpore.app.napari.layers`.
"""

from __future__ import annotations

import numpy as np
from napari.qt.threading import thread_worker
from qtpy.QtCore import Qt
from qtpy.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from ctpore.app.napari.layers import (
    INSPECTOR_ROLES,
    ROLE,
    Cancelled,
    inspect_layers,
    reconstruct_layers,
    summary_of,
)
from ctpore.app.napari.controls import (LayerChoice, SampleChoice, WeightsField, WorkerDock, fit_picture, one_line,
                                        scrolled, show_text)
from ctpore.pipelines.methods import method_names
from ctpore.errors import InputError

__all__ = ["ReconstructWidget", "AttentionInspector"]


class ReconstructWidget(WorkerDock, QWidget):
    """Pick an image layer, the method, the weights and the device; reconstruct its pores.

    Adds the pore probability (an image layer) and the pores (a labels layer) with the source's
    scale, and shows the metrics. Cancel stops between chunks of slices and adds nothing.
    """

    def __init__(self, napari_viewer):
        super().__init__()
        self.viewer = napari_viewer
        self.layer_choice = LayerChoice(napari_viewer)
        self.sample_choice = SampleChoice(napari_viewer, self.layer_choice)
        self.method = QComboBox()
        self.method.addItems(method_names(auto=True))
        self.weights = WeightsField()
        self.device = QComboBox()
        self.device.addItems(["cpu", "cuda"])
        self.run_button = QPushButton("Reconstruct")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.progress = QProgressBar()
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextSelectableByMouse)
        form = QFormLayout()
        form.addRow("scan", self.layer_choice)
        form.addRow("sample", self.sample_choice)
        form.addRow("method", self.method)
        form.addRow("weights", self.weights)
        form.addRow("device", self.device)
        self.lay_out(form)
        self.worker = None
        self._stop = False
        self.metrics: dict | None = None

    def cancel(self):
        self._stop = True
        self.status.setText("cancelling after the current chunk…")

    def run(self):
        """Start the reconstruction of the chosen layer (in a thread)."""
        layer = self.layer_choice.layer()
        if layer is None:
            self.status.setText("open a scan first: there is no image layer to reconstruct")
            return
        data, scale, name = layer.data, tuple(layer.scale), layer.name
        method, weights, device = self.method.currentText(), self.weights.value(), self.device.currentText()
        try:
            sample = self.sample_choice.value()
        except InputError as exc:
            self.status.setText(f"error: {one_line(exc)}")
            return
        self._stop = False
        self.metrics = None

        @thread_worker
        def work():
            try:
                return "done", reconstruct_layers(data, name, scale, method, weights, device,
                                                  should_stop=lambda: self._stop, sample=sample)
            except Cancelled:
                return "cancelled", None
            except Exception as exc:  # said in the dock, in one line
                return "error", one_line(exc)

        self.start(work(), f"reconstructing {name}…")

    def _done(self, outcome):
        status, result = outcome
        if status == "cancelled":
            self.status.setText("cancelled: nothing was added")
            return
        if status == "error":
            self.status.setText(f"error: {result}")
            return
        layers, metrics = result
        for data, kwargs, kind in layers:
            added = getattr(self.viewer, f"add_{kind}")(data, **kwargs)
            if kwargs["metadata"].get(ROLE) == "sample":
                added.contour = 2  # the sample's outline on every slice, the scan visible inside it
        self.metrics = metrics
        cd, per = metrics.get("connectivity_density_per_mm3"), "mm³"
        if cd is None:  # the scan gave no length unit: per voxel
            cd, per = metrics.get("connectivity_density_per_voxel3", float("nan")), "voxel³"
        found = metrics.get("sample") or {}
        outside = found.get("outside_voxels", 0)
        of = f" (of the sample: {outside} voxels outside left out; {found.get('kind', found.get('mode'))})" \
            if outside else ""
        if outside and found.get("confident") is False:
            of += f"\nuncertain sample: {metrics.get('porosity_if_region_is_pore', float('nan')):.4f} if the region " \
                  "left out were pore"
        show_text(self.status,
            f"porosity {metrics['porosity']:.4f}{of}\nEuler number {metrics['euler_number']}\n"
            f"Betti numbers: pores {metrics['n_pores']}, tunnels {metrics.get('n_tunnels', '?')}, "
            f"cavities {metrics.get('n_cavities', '?')}\n"
            f"connectivity density {cd:.4g} per {per}\n"
            f"[{metrics['method']}, {metrics['seconds']:.1f} s, {metrics['attention_backend'] or '-'}]")


class AttentionInspector(QWidget):
    """Click a voxel (or type z, y, x): what each attention head of PoreFormer looks back at.

    Shows the heads x earlier slices heatmap (one row per head, named by its block's scale, on
    one colour scale with its colour bar; each row scaled alone only when asked), each head's
    entropy and mean look-back, and how alike the heads are; marks the voxel on its slice and,
    for each full-resolution head, the slice it attends to most; adds one small layer per head
    with its attention entropy around the point (head 0 shown). "Summarize the heads over the
    scan" shows what each head does over the whole scan, pore and solid voxels apart.
    """

    def __init__(self, napari_viewer):
        super().__init__()
        self.viewer = napari_viewer
        self.layer_choice = LayerChoice(napari_viewer)
        self.weights = WeightsField()
        self.coords = [QSpinBox() for _ in range(3)]
        for box in self.coords:
            box.setRange(0, 100_000)
        self.pick = QCheckBox("pick the voxel with a click")
        self.pick.setChecked(True)
        self.normalize_rows = QCheckBox("scale each row to its own maximum (rows not comparable)")
        self.show_button = QPushButton("Show the heads")
        self.summary_button = QPushButton("Summarize the heads over the scan")
        self.heatmap = QLabel()
        self.summary = QLabel("")  # short lines, no wrapping: the dock scrolls
        self.summary.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.scan_picture = QLabel()
        form = QFormLayout()
        form.addRow("scan", self.layer_choice)
        form.addRow("weights", self.weights)
        row = QHBoxLayout()
        for label, box in zip("zyx", self.coords):
            row.addWidget(QLabel(label))
            row.addWidget(box)
        form.addRow("voxel", row)
        box = QVBoxLayout(self)
        box.addLayout(form)
        box.addWidget(self.pick)
        box.addWidget(self.normalize_rows)
        box.addWidget(self.show_button)
        box.addWidget(self.summary_button)
        box.addWidget(scrolled(self.heatmap, self.summary, self.scan_picture), stretch=1)
        self.show_button.clicked.connect(self.show_heads)
        self.summary_button.clicked.connect(self.summarize)
        napari_viewer.mouse_drag_callbacks.append(self._on_click)
        self.worker = None
        self.summary_worker = None
        self.info: dict | None = None
        self.scan_summary: dict | None = None

    def _on_click(self, viewer, event):
        if not self.pick.isChecked() or event.type != "mouse_press":
            return
        layer = self.layer_choice.layer()
        if layer is None:
            return
        pos = np.round(layer.world_to_data(event.position)).astype(int)[-3:]
        self.set_point(pos)
        self.show_heads()

    def set_point(self, point) -> None:
        for box, v in zip(self.coords, point):
            box.setValue(int(v))

    def point(self) -> tuple[int, int, int]:
        return tuple(box.value() for box in self.coords)

    def show_heads(self):
        """Compute the heads' attention at the chosen voxel (in a thread)."""
        layer = self.layer_choice.layer()
        if layer is None:
            self.summary.setText("open a scan first: there is no image layer to inspect")
            return
        data, scale, point, weights = layer.data, tuple(layer.scale), self.point(), self.weights.value()
        normalize_rows = self.normalize_rows.isChecked()
        self.summary.setText(f"looking at voxel {point}…")

        @thread_worker
        def work():
            try:
                return "done", inspect_layers(data, point, scale, weights, normalize_rows=normalize_rows)
            except Exception as exc:  # said in the dock, in one line
                return "error", one_line(exc)

        self._layer = layer
        self.worker = work()
        self.worker.returned.connect(self._done)
        self.worker.start()

    def _done(self, outcome):
        status, result = outcome
        if status == "error":
            self.summary.setText(f"error: {result}")
            return
        layers, info = result
        for old in [lay for lay in self.viewer.layers if (lay.metadata or {}).get(ROLE) in INSPECTOR_ROLES]:
            self.viewer.layers.remove(old)
        for data, kwargs, kind in layers:
            getattr(self.viewer, f"add_{kind}")(data, **kwargs)
        view = info["view"]
        if self.viewer.dims.ndim == 3:  # view the voxel's slice, where its marker is
            self.viewer.dims.set_point(0, self._layer.data_to_world(view.point)[0])
        self.info = info
        fit_picture(self.heatmap, info["heatmap"], self._room())
        lines = [f"voxel {view.point}; the slice each head attends to most:"]
        for b, label in enumerate(view.labels):
            lines.append(f"  {label}: " + ", ".join(str(int(t)) for t in view.top[b]))
        lines.append(f"heads alike (full resolution, 1 = copies): {info['similarity']:.2f}")
        show_text(self.summary, "\n".join(lines))

    def _room(self) -> int:
        """Width the dock's pictures can take without a horizontal scroll bar."""
        return max(320, self.width() - 40)

    def summarize(self):
        """What each head does over the whole scan (in a thread): the picture in the dock."""
        layer = self.layer_choice.layer()
        if layer is None:
            self.summary.setText("open a scan first: there is no image layer to summarize")
            return
        name, data, weights = layer.name, layer.data, self.weights.value()
        pores = [lay for lay in self.viewer.layers
                 if (lay.metadata or {}).get(ROLE) == "pores" and lay.metadata.get("ctpore_source") == name]
        pdata, pname = (pores[0].data, pores[0].name) if pores else (None, "")
        self.summary_button.setEnabled(False)
        self.summary.setText(f"summarizing the heads over {name}"
                             f"{f' (pore or solid from {pname})' if pores else ''}…")

        @thread_worker
        def work():
            try:
                return "done", summary_of(data, name, weights, pores=pdata, pores_name=pname)
            except Exception as exc:  # said in the dock, in one line
                return "error", one_line(exc)

        self.summary_worker = work()
        self.summary_worker.returned.connect(self._summarized)
        self.summary_worker.start()

    def _summarized(self, outcome):
        status, result = outcome
        self.summary_button.setEnabled(True)
        if status == "error":
            self.summary.setText(f"error: {result}")
            return
        self.scan_summary, rgb = result
        fit_picture(self.scan_picture, rgb, self._room())
        s = self.scan_summary["sample"]
        show_text(self.summary, f"{self.scan_summary['scan']}: {s['voxels']} voxels in {s['columns']} pixel columns\n"
                                 f"pore or solid: {self.scan_summary['pore_source']}")
