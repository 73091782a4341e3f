"""The work of the Analyze dock (no Qt): ``ctpore analyze``'s figures of a pores layer within a sample
layer, the thickness map as a layer, the pore-size plot as a picture and the figures as text."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ctpore.app.napari.layers import ROLE, SAMPLE_MASK_ROLE
from ctpore.app.napari.tuning import LABELS_ROLE

__all__ = ["pores_choices", "analyze_layer", "figures_text"]


def pores_choices(layers) -> list[str]:
    """The labels layers that can be pores: ctpore's pores first, then any other 0/1 labels layer."""
    out = []
    for layer in layers:
        if type(layer).__name__ != "Labels":
            continue
        role = (layer.metadata or {}).get(ROLE) if isinstance(layer.metadata, dict) else None
        if role in ("sample", SAMPLE_MASK_ROLE, LABELS_ROLE):
            continue
        out.append((role != "pores", layer.name))
    return [name for _, name in sorted(out)]


def analyze_layer(pores, scale, sample: Optional[np.ndarray] = None, units_known: bool = True,
                  memory_gb: Optional[float] = None, progress=None) -> dict:
    """``ctpore analyze``'s figures of ``pores`` (a labels layer's data, 0/1) with voxel size ``scale``
    (mm, z y x) within ``sample``; adds ``thickness`` (the map, float32 diameters) and ``psd_rgb``
    (the plot)."""
    from ctpore.data.io.geometry import geometry_from_array
    from ctpore.pipelines.analysis import SlabsInMemory, analyze_volume
    from ctpore.pipelines.analysis_outputs import psd_image

    p = np.asarray(pores)
    if p.ndim != 3:
        from ctpore.errors import InputError

        raise InputError(f"the pores layer is {p.ndim}D; analyze takes a 3D (Z, Y, X) pores layer")
    geom = geometry_from_array(p.shape, tuple(float(s) for s in scale[-3:]) if units_known else None)
    sink = SlabsInMemory()
    res = analyze_volume((p > 0).astype(np.uint8), geom, sample=None if sample is None else np.asarray(sample) > 0,
                         memory_gb=memory_gb, thickness_writer=sink, progress=progress)
    unit_name = "mm" if res["units_known"] else "voxel"
    res["thickness"] = sink.volume()
    res["psd_rgb"] = np.asarray(psd_image(res["psd_counts"], res["unit"] or 1.0, unit_name, res).convert("RGB"))
    res["unit_name"] = unit_name
    return res


def figures_text(res: dict) -> str:
    """The figures as a few lines of text."""
    u = res["unit_name"]

    def f(v, nd=4):
        return "-" if v is None else (f"{v:.{nd}g}" if isinstance(v, float) else str(v))

    perc = ", ".join("-" if v is None else f"{v:.4f}" for v in res["percolating_porosity_zyx"])
    yes = ", ".join("-" if v is None else ("yes" if v else "no") for v in res["percolates_zyx"])
    turned = [face["turned_deg"] for face in res.get("faces_zyx") or [] if isinstance(face, dict)]
    sides = f"; y, x along the block's sides, turned {turned[0]:g} deg" if turned else ""
    return "\n".join([
        f"porosity {f(res['porosity'])}  (connected {f(res['connected_porosity'])}, "
        f"isolated {f(res['isolated_porosity'])})",
        f"percolating z, y, x: {perc}  (percolates: {yes}{sides})",
        f"pore diameter d10 {f(res['thickness_d10'])}, d50 {f(res['thickness_d50'])}, d90 {f(res['thickness_d90'])}, "
        f"mean {f(res['thickness_mean'])} {u}",
        f"specific surface {f(res['specific_surface'])} per {u}, mean breadth {f(res['mean_breadth'])} {u}, "
        f"Euler number {res['euler_number']}",
    ])
