"""The work behind the Fine-tune dock, without Qt: a labels layer to paint pore and solid on, the
fine-tuning of a learned method on it, and where to label next.

A labels layer made here holds 0 (not painted), 1 (pore) and 2 (solid), in colours that read on a
grey scan, and carries ``metadata["ctpore_role"] = "training labels"`` (so no scan or sample list
offers it). :func:`tune_on_layers` runs :func:`ctpore.pipelines.finetune.finetune_volumes` on the
scan's and the labels' arrays; :func:`label_next` finds the slice, and the place in it, where the
model is least sure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import numpy as np
from scipy import ndimage as ndi

from ctpore.app.napari.layers import ROLE, Cancelled, volume_of
from ctpore.data.sparse_labels import PORE, SOLID, check_sparse

__all__ = ["LABELS_ROLE", "NEXT_ROLE", "PORE_COLOUR", "SOLID_COLOUR", "labels_layer", "tune_on_layers",
           "label_next"]

#: The role of a layer of training labels.
LABELS_ROLE = "training labels"

#: The role of the "label next" marker.
NEXT_ROLE = "label next"

#: Pore and solid as painted (orange and cyan: both read on a grey scan).
PORE_COLOUR, SOLID_COLOUR = "#ff7f0e", "#17becf"


def labels_layer(shape, name: str, scale=None):
    """A layer of training labels for a scan of ``shape`` (napari LayerData): empty, pore = 1,
    solid = 2 in :data:`PORE_COLOUR` and :data:`SOLID_COLOUR`, the classes named (the status bar
    says "class: pore")."""
    from napari.utils.colormaps import DirectLabelColormap

    cmap = DirectLabelColormap(color_dict={None: "transparent", 0: "transparent", PORE: PORE_COLOUR,
                                           SOLID: SOLID_COLOUR})
    kwargs = {"name": f"{name} labels", "colormap": cmap, "opacity": 0.7,
              "features": {"index": [0, PORE, SOLID], "class": ["not labelled", "pore", "solid"]},  # named classes
              "metadata": {ROLE: LABELS_ROLE, "ctpore_source": name, "ctpore_about": "paint 1 = pore, 2 = solid"}}
    if scale is not None:
        kwargs["scale"] = tuple(scale)
    return np.zeros(tuple(int(s) for s in shape), np.uint8), kwargs, "labels"


def tune_on_layers(scan, name: str, labels, out: str | Path, *, scale=None, method: str = "poreformer",
                   weights: Optional[str] = None, steps: int = 100, device: str = "cpu",
                   progress: Optional[Callable[[int, int, str], None]] = None,
                   should_stop: Callable[[], bool] = lambda: False) -> dict:
    """Fine-tune ``method`` on the painted ``labels`` of the ``scan`` layer's data; write ``out``
    (replaced if there) and return the report (:func:`~ctpore.pipelines.finetune.finetune`).
    :class:`Cancelled` when ``should_stop`` says so before the weights are written."""
    from ctpore.data.io import geometry_from_array
    from ctpore.pipelines.finetune import finetune_volumes

    vol = volume_of(scan, f"layer {name!r}")
    lab = check_sparse(np.asarray(labels), f"the labels of {name!r}")
    if lab.shape != vol.shape:
        from ctpore.errors import InputError

        raise InputError(f"the labels' shape {lab.shape} differs from the scan's {vol.shape}")
    spacing = tuple(float(v) for v in (scale if scale is not None else (1.0, 1.0, 1.0)))[-3:]
    geom = geometry_from_array(vol.shape, spacing)

    def tick(done: int, total: int, stage: str) -> None:
        if should_stop():
            raise Cancelled
        if progress is not None:
            progress(done, total, stage)

    return finetune_volumes([vol], [geom], [lab], out, sources=[f"napari layer {name!r}"],
                            label_sources=[f"napari layer {name!r} labels"], method=method, weights=weights,
                            steps=steps, device=device, progress=tick)


def label_next(prob, scale=None) -> tuple[tuple[int, int, int], tuple]:
    """Where to label next: the slice with the highest mean entropy of the pore probability, and in
    it the centre of the most uncertain neighbourhood (15 pixels across). Returns ``(z, y, x)`` and a
    points LayerData that marks it."""
    p = np.clip(np.asarray(prob, np.float64), 1e-6, 1 - 1e-6)
    ent = -(p * np.log2(p) + (1 - p) * np.log2(1 - p))
    z = int(np.argmax(ent.mean(axis=(1, 2))))
    local = ndi.uniform_filter(ent[z], size=15, mode="nearest")
    y, x = (int(v) for v in np.unravel_index(int(np.argmax(local)), local.shape))
    kwargs = {"name": "label next", "size": 12, "face_color": "transparent", "border_color": "yellow",
              "metadata": {ROLE: NEXT_ROLE}}
    if scale is not None:
        kwargs["scale"] = tuple(scale)
    return (z, y, x), (np.array([[z, y, x]], float), kwargs, "points")
