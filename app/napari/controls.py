"""The small controls the two docks share (Qt, through qtpy): the scan and sample-mask pickers, the
weights field, a scrolling dock, one-line errors and pictures fitted to the dock's width."""

from __future__ import annotations

import numpy as np
from qtpy.QtCore import Qt
from qtpy.QtGui import QImage, QPixmap
from qtpy.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from ctpore.app.napari.layers import (
    AXIS_LABELS,
    is_output,
    sample_mask_choices,
    sample_of,
)
from ctpore.errors import InputError

__all__ = ["image_layers", "name_axes", "LayerChoice", "SampleChoice", "WeightsField", "scrolled", "show_text",
           "one_line", "pixmap", "fit_picture", "WorkerDock"]


def image_layers(viewer) -> list:
    """The viewer's scans: its image layers, less the results ctpore added (probability, entropy)."""
    import napari

    return [layer for layer in viewer.layers
            if isinstance(layer, napari.layers.Image) and not is_output(layer.metadata)]


def name_axes(viewer) -> None:
    """Name a 3D viewer's axes z, y, x (napari would show -3, -2, -1)."""
    if viewer.dims.ndim == len(AXIS_LABELS):
        viewer.dims.axis_labels = AXIS_LABELS


class LayerChoice(QComboBox):
    """The scans of the viewer (image layers that are not ctpore's results), kept up to date."""

    def __init__(self, viewer):
        super().__init__()
        self.viewer = viewer
        viewer.layers.events.inserted.connect(self.refresh)
        viewer.layers.events.removed.connect(self.refresh)
        self.refresh()

    def refresh(self, *_):
        name_axes(self.viewer)
        current = self.currentText()
        self.clear()
        names = [layer.name for layer in image_layers(self.viewer)]
        self.addItems(names)
        if current in names:
            self.setCurrentText(current)

    def layer(self):
        name = self.currentText()
        return self.viewer.layers[name] if name in self.viewer.layers else None


class SampleChoice(QComboBox):
    """Which voxels are the sample: found (auto), all, or a 0/1 labels layer of the scan's shape
    (painted, loaded, or the found sample edited), kept up to date with the layers and the scan."""

    MODES = ("auto (found by its shape)", "all voxels")

    def __init__(self, viewer, scans: LayerChoice):
        super().__init__()
        self.viewer, self.scans = viewer, scans
        viewer.layers.events.inserted.connect(self.refresh)
        viewer.layers.events.removed.connect(self.refresh)
        scans.currentTextChanged.connect(self.refresh)
        self.refresh()

    def refresh(self, *_):
        current = self.currentText()
        scan = self.scans.layer()
        names = sample_mask_choices(self.viewer.layers, np.shape(scan.data)) if scan is not None else []
        self.clear()
        self.addItems([*self.MODES, *names])
        if current in (*self.MODES, *names):
            self.setCurrentText(current)

    def value(self):
        """``"auto"``, ``"all"`` or the chosen layer's mask (:func:`~ctpore.app.napari.layers.sample_of`)."""
        text = self.currentText()
        if text == self.MODES[0] or not text:
            return "auto"
        if text == self.MODES[1]:
            return "all"
        return sample_of(text, self.viewer.layers[text] if text in self.viewer.layers else None)


class WeightsField(QWidget):
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


def scrolled(*widgets) -> QScrollArea:
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


def show_text(label: QLabel, text: str) -> None:
    """Set a label's text and make the dock give it the height of all its lines."""
    label.setText(text)
    label.setMinimumHeight(label.fontMetrics().lineSpacing() * (text.count("\n") + 1) + 4)
    label.updateGeometry()


def one_line(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, InputError) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())


def pixmap(rgb: np.ndarray) -> QPixmap:
    rgb = np.ascontiguousarray(rgb, np.uint8)
    h, w, _ = rgb.shape
    image = QImage(rgb.data, w, h, 3 * w, QImage.Format_RGB888).copy()
    return QPixmap.fromImage(image)


def fit_picture(label: QLabel, rgb: np.ndarray, width: int) -> None:
    """Show a picture in a label, scaled down (smoothly) to ``width`` pixels where it is wider, but
    never below 80% (its text stays readable; the dock scrolls instead)."""
    pix = pixmap(rgb)
    if pix.width() > width:
        pix = pix.scaledToWidth(max(width, int(0.8 * pix.width())), Qt.SmoothTransformation)
    label.setPixmap(pix)
    label.setFixedSize(pix.size())
    label.updateGeometry()


class WorkerDock:
    """What a dock that runs one job at a time in a napari ``thread_worker`` shares: it has
    ``run_button``, ``cancel_button``, ``progress``, ``status``, ``run``, ``cancel`` and a
    ``_done(outcome)``; :meth:`lay_out` places them, :meth:`start` runs a worker with the buttons and
    a busy bar, and they come back when it ends."""

    def lay_out(self, form, *more_buttons, below=()) -> None:
        """The dock's layout: ``form``, a row of Run, Cancel and ``more_buttons``, the progress bar, the
        widgets ``below``, the status (scrolled); Run and Cancel connected."""
        buttons = QHBoxLayout()
        for b in (self.run_button, self.cancel_button, *more_buttons):
            buttons.addWidget(b)
        box = QVBoxLayout(self)
        box.addLayout(form)
        box.addLayout(buttons)
        box.addWidget(self.progress)
        for w in below:
            box.addWidget(w)
        box.addWidget(scrolled(self.status), stretch=1)
        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(self.cancel)

    def start(self, worker, text: str) -> None:
        """Run ``worker`` (its result goes to ``_done``), saying ``text`` meanwhile."""
        self.worker = worker
        worker.returned.connect(self._done)
        worker.finished.connect(self._finished)
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress.setRange(0, 0)  # busy
        self.status.setText(text)
        worker.start()

    def _finished(self):
        self.run_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.progress.setRange(0, 1)
        self.progress.setValue(1)
