"""npe2 reader, writers and sample data: thin wrappers over :mod:`ctpore.app.napari.layers`."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ctpore.app.napari.layers import is_readable, scan_layer, simulated_layers, write_layer

__all__ = ["get_reader", "write_image", "write_labels", "simulated_scan"]


def get_reader(path) -> Optional[Callable]:
    """A function that reads ``path`` (a scan file or a folder of slices) into an image
    layer, or None for what ctpore cannot read. Never raises."""
    if isinstance(path, (list, tuple)):
        if len(path) != 1:
            return None
        path = path[0]
    return _read if is_readable(path) else None


def _read(path) -> list:
    if isinstance(path, (list, tuple)):
        path = path[0]
    return [scan_layer(path)]


def write_image(path: str, data: Any, meta: dict) -> list[str]:
    """Save an image layer as NIfTI (``.nii``, ``.nii.gz``) or TIFF."""
    return write_layer(path, data, meta, "image")


def write_labels(path: str, data: Any, meta: dict) -> list[str]:
    """Save a labels layer (pores) as NIfTI or TIFF."""
    return write_layer(path, data, meta, "labels")


def simulated_scan() -> list:
    """Sample data: a simulated scan of a porous rock and its true pores."""
    return simulated_layers()
