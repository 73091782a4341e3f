"""The two dock widgets: Reconstruct pores, and the Attention inspector (Qt, through qtpy).

Both run their work in a napari ``thread_worker`` so the viewer stays responsive, and say what
went wrong in the dock (one line, no traceback). The work itself is in
:mod:`ctpore.app.napari.layers`.
"""

from __future__ import annotations

import numpy as np
from napari.qt.threading import thread_worker
from qtpy.QtCore import Qt
from qtpy.QtGui import QImage, QPixmap
from qtpy.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from ctpore.app.napari.layers import Cancelled, inspect_layers, reconstruct_layers
from ctpore.pipelines.methods import method_names
from ctpore.errors import InputError

__all__ = ["ReconstructWidget", "AttentionInspector"]


def _image_layers(viewer) -> list:
    import napari

    return [layer for layer in viewer.layers if isinstance(layer, napari.layers.Image)]


class _LayerChoice(QComboBox):
    """The image layers of the viewer, kept up to date."""

    def __init__(self, viewer):
        super().__init__()
        self.viewer = viewer
        viewer.layers.events.inserted.connect(self.refresh)
        viewer.layers.events.removed.connect(self.refresh)
        self.refresh()

    def refresh(self, *_):
        current = self.currentText()
        self.clear()
        names = [layer.name for layer in _image_layers(self.viewer)]
        self.addItems(names)
        if current in names:
            self.setCurrentText(current)

    def layer(self):
        name = self.currentText()
        return self.viewer.layers[name] if name in self.viewer.layers else None


class _WeightsField(QWidget):
    def __init__(self):
        super().__init__()
        self.edit = QLineEdit()
        self.edit.setPlaceholderText("shipped weights")
        browse = QPushButton("…")
        browse.clicked.connect(self._browse)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.edit)
        row.addWidget(browse)

    def _browse(self):
        path, _ = QFileDialog.getOpenFileName(self, "PoreFormer weights", "", "safetensors (*.safetensors)")
        if path:
            self.edit.setText(path)

    def value(self):
        return self.edit.text().strip() or None


def _scrolled(*widgets) -> QScrollArea:
    """The results part of a dock: it scrolls when the dock is shorter than what it shows."""
    inner = QWidget()
    box = QVBoxLayout(inner)
    for w in widgets:
        box.addWidget(w)
    box.addStretch()
    area = QScrollArea()
    area.setWidgetResizable(True)
    area.setWidget(inner)
    return area


def _show_text(label: QLabel, text: str) -> None:
    """Set a label's text and make the dock give it the height of all its lines."""
    label.setText(text)
    label.setMinimumHeight(label.fontMetrics().lineSpacing() * (text.count("\n") + 1) + 4)
    label.updateGeometry()


def _one_line(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, InputError) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())


class ReconstructWidget(QWidget):
    """Pick an image layer, the method, the weights and the device; reconstruct its pores.

    Adds the pore probability (an image layer) and the pores (a labels layer) with the source's
    scale, and shows the metrics. Cancel stops between chunks of slices and adds nothing.
    """

    def __init__(self, napari_viewer):
        super().__init__()
        self.viewer = napari_viewer
        self.layer_choice = _LayerChoice(napari_viewer)
        self.method = QComboBox()
        self.method.addItems(method_names(auto=True))
        self.weights = _WeightsField()
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
        form.addRow("method", self.method)
        form.addRow("weights", self.weights)
        form.addRow("device", self.device)
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.cancel_button)
        box = QVBoxLayout(self)
        box.addLayout(form)
        box.addLayout(buttons)
        box.addWidget(self.progress)
        box.addWidget(_scrolled(self.status), stretch=1)
        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(self.cancel)
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
        self._stop = False
        self.metrics = None

        @thread_worker
        def work():
            try:
                return "done", reconstruct_layers(data, name, scale, method, weights, device,
                                                  should_stop=lambda: self._stop)
            except Cancelled:
                return "cancelled", None
            except Exception as exc:  # said in the dock, in one line
                return "error", _one_line(exc)

        self.worker = work()
        self.worker.returned.connect(self._done)
        self.worker.finished.connect(self._finished)
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress.setRange(0, 0)  # busy
        self.status.setText(f"reconstructing {name}…")
        self.worker.start()

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
            getattr(self.viewer, f"add_{kind}")(data, **kwargs)
        self.metrics = metrics
        cd, per = metrics.get("connectivity_density_per_mm3"), "mm³"
        if cd is None:  # the scan gave no length unit: per voxel
            cd, per = metrics.get("connectivity_density_per_voxel3", float("nan")), "voxel³"
        _show_text(self.status,
            f"porosity {metrics['porosity']:.4f}\nEuler number {metrics['euler_number']}\n"
            f"connectivity density {cd:.4g} per {per}\npores {metrics['n_pores']}\n"
            f"[{metrics['method']}, {metrics['seconds']:.1f} s, {metrics['attention_backend'] or '-'}]")

    def _finished(self):
        self.run_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.progress.setRange(0, 1)
        self.progress.setValue(1)


def _pixmap(rgb: np.ndarray) -> QPixmap:
    rgb = np.ascontiguousarray(rgb, np.uint8)
    h, w, _ = rgb.shape
    image = QImage(rgb.data, w, h, 3 * w, QImage.Format_RGB888).copy()
    return QPixmap.fromImage(image)


class AttentionInspector(QWidget):
    """Click a voxel (or type z, y, x): what each attention head of PoreFormer looks back at.

    Shows the heads x earlier slices heatmap (one row per block and head), each head's entropy
    and mean look-back, and how alike the heads are; marks in the viewer the slice each
    full-resolution head attends to most, and adds one layer per head with its attention entropy
    per pixel around the point on the current slice.
    """

    def __init__(self, napari_viewer):
        super().__init__()
        self.viewer = napari_viewer
        self.layer_choice = _LayerChoice(napari_viewer)
        self.weights = _WeightsField()
        self.coords = [QSpinBox() for _ in range(3)]
        for box in self.coords:
            box.setRange(0, 100_000)
        self.pick = QCheckBox("pick the voxel with a click")
        self.pick.setChecked(True)
        self.show_button = QPushButton("Show the heads")
        self.heatmap = QLabel()
        self.summary = QLabel("")
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextSelectableByMouse)
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
        box.addWidget(self.show_button)
        box.addWidget(_scrolled(self.heatmap, self.summary), stretch=1)
        self.show_button.clicked.connect(self.show_heads)
        napari_viewer.mouse_drag_callbacks.append(self._on_click)
        self.worker = None
        self.info: dict | None = None

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
        self.summary.setText(f"looking at voxel {point}…")
        @thread_worker
        def work():
            try:
                return "done", inspect_layers(data, point, scale, weights)
            except Exception as exc:  # said in the dock, in one line
                return "error", _one_line(exc)

        self.worker = work()
        self.worker.returned.connect(self._done)
        self.worker.start()

    def _done(self, outcome):
        status, result = outcome
        if status == "error":
            self.summary.setText(f"error: {result}")
            return
        layers, info = result
        for name in [lay.name for lay in self.viewer.layers]:
            if name.startswith("head ") and name.endswith(" attention entropy") or name == "most attended slices":
                self.viewer.layers.remove(name)
        for data, kwargs, kind in layers:
            getattr(self.viewer, f"add_{kind}")(data, **kwargs)
        self.info = info
        pix = _pixmap(info["heatmap"])
        self.heatmap.setPixmap(pix)
        self.heatmap.setFixedSize(pix.size())
        view = info["view"]
        lines = [f"voxel {view.point}: heads x slices {int(view.slices[0])}..{int(view.slices[-1])}"]
        for b, name in enumerate(view.blocks):
            for h in range(view.weights.shape[1]):
                lines.append(f"{name} head {h}: top slice {view.top[b, h]}, look-back {view.lookback[b, h]:.1f}, "
                             f"entropy {view.entropy[b, h]:.2f}")
        lines.append(f"heads alike (full resolution, 1 = copies): {info['similarity']:.2f}")
        _show_text(self.summary, "\n".join(lines))
