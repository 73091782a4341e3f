"""The Analyze dock (Qt, through qtpy): ``ctpore analyze`` on a pores layer within a sample layer; the
thickness map as a layer, the pore-size distribution plotted in the dock, the connectivity and the
other figures as text. The work runs in a napari ``thread_worker``; it is in
:mod:`ctpore.app.napari.measure`."""

from __future__ import annotations

import numpy as np
from napari.qt.threading import thread_worker
from qtpy.QtCore import Qt
from qtpy.QtWidgets import QComboBox, QFormLayout, QLabel, QProgressBar, QPushButton, QWidget

from ctpore.app.napari.controls import WorkerDock, fit_picture, one_line, show_text
from ctpore.app.napari.layers import ROLE, sample_mask_choices
from ctpore.app.napari.measure import analyze_layer, figures_text, pores_choices

__all__ = ["AnalyzeWidget"]

EVERY_VOXEL = "every voxel"


class AnalyzeWidget(WorkerDock, QWidget):
    """Pick a pores layer (and the sample), Analyze: the thickness map is added as a layer, the
    pore-size distribution drawn below, the figures written beside it."""

    def __init__(self, napari_viewer):
        super().__init__()
        self.viewer = napari_viewer
        self.pores_choice = QComboBox()
        self.sample_choice = QComboBox()
        self.run_button = QPushButton("Analyze")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.progress = QProgressBar()
        self.status = QLabel("pick the pores (a reconstruction's, or any 0/1 labels layer), then Analyze")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.picture = QLabel()
        form = QFormLayout()
        form.addRow("pores", self.pores_choice)
        form.addRow("sample", self.sample_choice)
        self.lay_out(form, below=(self.picture,))
        for event in (napari_viewer.layers.events.inserted, napari_viewer.layers.events.removed):
            event.connect(self.refresh)
        self.pores_choice.currentTextChanged.connect(self.refresh_sample)
        self.refresh()
        self.worker = None
        self.result: dict | None = None

    def refresh(self, *_):
        current = self.pores_choice.currentText()
        names = pores_choices(self.viewer.layers)
        self.pores_choice.clear()
        self.pores_choice.addItems(names)
        if current in names:
            self.pores_choice.setCurrentText(current)
        self.refresh_sample()

    def refresh_sample(self, *_):
        current = self.sample_choice.currentText()
        name = self.pores_choice.currentText()
        shape = np.shape(self.viewer.layers[name].data) if name in self.viewer.layers else None
        names = [n for n in (sample_mask_choices(self.viewer.layers, shape) if shape else []) if n != name]
        self.sample_choice.clear()
        self.sample_choice.addItems([EVERY_VOXEL, *names])
        # the reconstruction's own sample, when it has one, is the default
        own = f"{name.removesuffix(' pores')} sample"
        self.sample_choice.setCurrentText(current if current in names else own if own in names else EVERY_VOXEL)

    def cancel(self):
        if self.worker is not None:
            self.worker.quit()

    def run(self):
        name = self.pores_choice.currentText()
        if name not in self.viewer.layers:
            show_text(self.status, "no pores layer: reconstruct a scan, or open a 0/1 labels layer")
            return
        layer = self.viewer.layers[name]
        sname = self.sample_choice.currentText()
        sample = np.asarray(self.viewer.layers[sname].data) if sname in self.viewer.layers else None
        meta = layer.metadata if isinstance(layer.metadata, dict) else {}
        known = (meta.get("ctpore_metrics") or {}).get("spacing_mm_zyx", True) is not None
        data, scale = np.asarray(layer.data), tuple(layer.scale)

        @thread_worker
        def work():
            try:
                return analyze_layer(data, scale, sample, units_known=known)
            except Exception as exc:  # one line in the dock, not a traceback
                return exc

        self.result = None
        self._name, self._scale = name, scale
        self.start(work(), f"analysing {name} ...")

    def _done(self, outcome):
        if isinstance(outcome, BaseException):
            show_text(self.status, one_line(outcome))
            return
        self.result = outcome
        title = f"{self._name} thickness ({outcome['unit_name']})"
        if title in self.viewer.layers:
            self.viewer.layers.remove(title)
        self.viewer.add_image(outcome["thickness"], name=title, scale=self._scale, colormap="turbo",
                              blending="additive", metadata={ROLE: "thickness"})
        fit_picture(self.picture, outcome["psd_rgb"], max(320, self.width() - 20))
        show_text(self.status, figures_text(outcome))
