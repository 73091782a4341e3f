"""The Fine-tune dock (Qt, through qtpy): paint a few slices of pore and solid, tune a learned method
on them, and reconstruct with the tuned weights; "Label next" marks where the model is least sure.

The work runs in a napari ``thread_worker`` (progress, cancel, one line when something is wrong);
the work itself is in :mod:`ctpore.app.napari.tuning`.
"""

from __future__ import annotations

from pathlib import Path

from napari.qt.threading import thread_worker
from qtpy.QtCore import Qt
from qtpy.QtWidgets import (QComboBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit, QProgressBar, QPushButton,
                            QSpinBox, QWidget)

from ctpore.app.napari.controls import LayerChoice, WeightsField, WorkerDock, one_line, show_text
from ctpore.app.napari.layers import ROLE, Cancelled, reconstruct_layers
from ctpore.app.napari.tuning import LABELS_ROLE, label_next, labels_layer, tune_on_layers

__all__ = ["FineTuneWidget"]


class FineTuneWidget(WorkerDock, QWidget):
    """Pick a scan, paint its labels layer (1 pore, 2 solid) on a few slices, fine-tune; the tuned
    weights are written to the path shown and the scan is reconstructed with them."""

    def __init__(self, napari_viewer):
        super().__init__()
        self.viewer = napari_viewer
        self.layer_choice = LayerChoice(napari_viewer)
        self.labels_choice = QComboBox()
        self.new_labels = QPushButton("New labels layer")
        self.method = QComboBox()
        self.method.addItems(["poreformer", "unet3d", "unet2d"])
        self.weights = WeightsField()
        self.steps = QSpinBox()
        self.steps.setRange(1, 10000)
        self.steps.setValue(100)
        self.out = QLineEdit(str(Path.home() / "ctpore" / "tuned.safetensors"))
        self.run_button = QPushButton("Fine-tune")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.next_button = QPushButton("Label next")
        self.progress = QProgressBar()
        self.status = QLabel("paint 1 = pore and 2 = solid on a few slices of a labels layer, then Fine-tune")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextSelectableByMouse)
        form = QFormLayout()
        form.addRow("scan", self.layer_choice)
        row = QHBoxLayout()
        row.addWidget(self.labels_choice, stretch=1)
        row.addWidget(self.new_labels)
        form.addRow("labels", row)
        form.addRow("method", self.method)
        form.addRow("start from", self.weights)
        form.addRow("steps (at most)", self.steps)
        form.addRow("save tuned weights to", self.out)
        self.lay_out(form, self.next_button)
        self.new_labels.clicked.connect(self.add_labels)
        self.next_button.clicked.connect(self.mark_next)
        for event in (napari_viewer.layers.events.inserted, napari_viewer.layers.events.removed):
            event.connect(self.refresh_labels)
        self.refresh_labels()
        self.worker = None
        self._stop = False
        self.report: dict | None = None

    # -- the labels ------------------------------------------------------------------------------

    def refresh_labels(self, *_):
        current = self.labels_choice.currentText()
        self.labels_choice.clear()
        names = [lay.name for lay in self.viewer.layers if type(lay).__name__ == "Labels"
                 and isinstance(lay.metadata, dict) and lay.metadata.get(ROLE) == LABELS_ROLE]
        self.labels_choice.addItems(names)
        if current in names:
            self.labels_choice.setCurrentText(current)

    def add_labels(self):
        """Add an empty labels layer for the chosen scan (pore and solid in their colours), and select it."""
        scan = self.layer_choice.layer()
        if scan is None:
            self.status.setText("open a scan first")
            return
        data, kwargs, _kind = labels_layer(scan.data.shape, scan.name, scan.scale)
        layer = self.viewer.add_labels(data, **kwargs)
        layer.selected_label = 1
        self.refresh_labels()
        self.labels_choice.setCurrentText(layer.name)
        self.status.setText("paint 1 = pore (orange) and 2 = solid (cyan) on a few slices, in any view")

    def mark_next(self):
        """Mark where to label next, from the scan's latest pore probability."""
        scan = self.layer_choice.layer()
        probs = [lay for lay in self.viewer.layers if isinstance(lay.metadata, dict)
                 and lay.metadata.get(ROLE) == "probability" and scan is not None
                 and lay.metadata.get("ctpore_source") in (scan.name, f"{scan.name} (tuned)")]
        if not probs:
            self.status.setText("reconstruct the scan first (the hint reads its pore probability)")
            return
        (z, y, x), (pts, kwargs, _kind) = label_next(probs[-1].data, probs[-1].scale)
        if "label next" in self.viewer.layers:
            self.viewer.layers.remove("label next")
        self.viewer.add_points(pts, **kwargs)
        step = list(self.viewer.dims.current_step)
        step[0] = z
        self.viewer.dims.current_step = tuple(step)
        self.status.setText(f"label next: slice {z}, around (y, x) = ({y}, {x}), where the model is least sure")

    # -- tuning ------------------------------------------------------------------------------------

    def cancel(self):
        self._stop = True
        self.status.setText("cancelling…")

    def run(self):
        """Fine-tune on the chosen labels (in a thread), then reconstruct with the tuned weights."""
        scan = self.layer_choice.layer()
        name = self.labels_choice.currentText()
        if scan is None or not name:
            self.status.setText("choose a scan and its labels layer (New labels layer, then paint)")
            return
        data, scale, sname = scan.data, tuple(scan.scale), scan.name
        labels = self.viewer.layers[name].data
        method, base, steps, out = (self.method.currentText(), self.weights.value(), self.steps.value(),
                                    Path(self.out.text()).expanduser())
        self._stop = False
        self.report = None

        @thread_worker
        def work():
            try:
                out.parent.mkdir(parents=True, exist_ok=True)
                rep = tune_on_layers(data, sname, labels, out, scale=scale, method=method, weights=base or None,
                                     steps=steps, should_stop=lambda: self._stop)
                layers, metrics = reconstruct_layers(data, f"{sname} (tuned)", scale, method, str(out),
                                                     should_stop=lambda: self._stop)
                return "done", (rep, layers)
            except Cancelled:
                return "cancelled", None
            except Exception as exc:  # said in the dock, in one line
                return "error", one_line(exc)

        self.start(work(), f"fine-tuning {method} on {name}…")

    def _done(self, outcome):
        status, result = outcome
        if status != "done":
            self.status.setText("cancelled: nothing was written" if status == "cancelled" else f"error: {result}")
            return
        rep, layers = result
        for data, kwargs, kind in layers:
            added = getattr(self.viewer, f"add_{kind}")(data, **kwargs)
            if kwargs["metadata"].get(ROLE) == "sample":
                added.contour = 2
        self.report = rep
        lines = [f"held back: {'; '.join(rep['split'])}"]
        for key, label in (("before", "before"), ("refit", "refitted"), ("after", "tuned")):
            if key in rep:
                r = rep[key]
                lines.append(f"{label}: MSE {r['mse']:.4f}, Dice {r['dice']:.3f}, |χ2D err| {r['euler_2d_error']}, "
                             f"boundary {r['boundary_shift_vox']:+.2f} vox")
        lines.append(f"-> {rep['weights']} ({rep['tuning']['steps']} steps, {rep['seconds']:.0f} s); reconstructed "
                     "with it")
        show_text(self.status, "\n".join(lines))
