"""The keys of ``ctpore analyze``'s figures, in the order they are written; :mod:`ctpore.data.metrics`
registers them with the metrics (group ``analysis``: a key taken twice is refused).

Each figure with a length in it has two keys, one per unit, as the metrics name them: ``_mm``,
``_mm2`` and ``_per_mm`` where the spacing is known; ``_voxel``, ``_voxel2`` and ``_per_voxel`` where
it is not (lengths in voxels of the smallest side). A record holds the one that applies.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["ANALYSIS_FIGURES", "FLOW_FIGURES", "HEADLINE", "analysis_key", "analysis_keys", "analysis_record"]

#: ``(figure, unit kind)``: the figure in :func:`ctpore.pipelines.analysis.analyze_volume`'s result
#: and how its key is suffixed (None: no unit; "length", "area", "per_length").
ANALYSIS_FIGURES = (
    ("porosity", None),
    ("euler_number", None),
    ("surface_area", "area"),
    ("specific_surface", "per_length"),
    ("specific_surface_solid", "per_length"),
    ("mean_breadth", "length"),
    ("thickness_mean", "length"),
    ("thickness_d10", "length"),
    ("thickness_d50", "length"),
    ("thickness_d90", "length"),
    ("drainage_d50", "length"),
    ("connected_porosity", None),
    ("isolated_porosity", None),
    ("percolating_porosity_zyx", None),
    ("percolates_zyx", None),
    ("porosity_expected", None),
    ("porosity_range", None),
    ("euler_number_range", None),
    ("percolating_porosity_range", None),
    ("ranges_by_level", None),
    ("sample_voxels", None),
)

#: The flow's figures (:mod:`ctpore.pipelines.flow`), in a record only where the flow was run: the
#: permeability in m² (voxels² where the units are unknown) and in darcy (only where they are known),
#: the tortuosity, and the cube they are of (its side and first voxel).
FLOW_FIGURES = (
    ("permeability_zyx", "permeability"),
    ("permeability_zyx", "darcy"),
    ("tortuosity_zyx", None),
    ("flow_cube_voxels", None),
    ("flow_cube_start_zyx", None),
)

#: The figures that are columns of ``ctpore batch``'s summary.
HEADLINE = ("specific_surface", "thickness_d50", "connected_porosity", "percolating_porosity_zyx")

_SUFFIX = {"length": ("_mm", "_voxel"), "area": ("_mm2", "_voxel2"), "per_length": ("_per_mm", "_per_voxel"),
           "permeability": ("_m2", "_voxel2"), "darcy": ("_darcy", None)}
#: Where a figure's result is found under a name of its own (the darcy figure of the permeability).
_SOURCE = {("permeability_zyx", "darcy"): "permeability_darcy_zyx"}


def analysis_key(figure: str, kind, known: bool) -> Optional[str]:
    """The key of ``figure`` in the record, with the unit suffix that applies (None: the figure has
    no key in these units, as darcy where the units are unknown)."""
    if kind is None:
        return figure
    suffix = _SUFFIX[kind][0 if known else 1]
    return None if suffix is None else figure + suffix


def analysis_keys() -> list[tuple[str, str]]:
    """``(key, figure)`` for every key a record may hold (both units of a figure with a length),
    the metrics' own ``porosity``, ``euler_number`` and ``sample_voxels`` included."""
    keys = [(analysis_key(f, kind, known), _SOURCE.get((f, kind), f)) for f, kind in ANALYSIS_FIGURES + FLOW_FIGURES
            for known in ((True, False) if kind else (True,))]
    return [(k, f) for k, f in keys if k is not None]


def analysis_record(result: dict) -> dict:
    """The figures of ``result`` under their keys, in :data:`ANALYSIS_FIGURES`' order."""
    known = bool(result.get("units_known", True))
    figures = ANALYSIS_FIGURES + (FLOW_FIGURES if "permeability_zyx" in result else ())
    out = {}
    for f, kind in figures:
        key = analysis_key(f, kind, known)
        if key is not None:
            out[key] = result.get(_SOURCE.get((f, kind), f))
    return out
