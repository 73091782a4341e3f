"""The keys of ``ctpore analyze``'s figures, in the order they are written; :mod:`ctpore.data.metrics`
registers them with the metrics (group ``analysis``: a key taken twice is refused).

Each figure with a length in it has two keys, one per unit, as the metrics name them: ``_mm``,
``_mm2`` and ``_per_mm`` where the spacing is known; ``_voxel``, ``_voxel2`` and ``_per_voxel`` where
it is not (lengths in voxels of the smallest side). A record holds the one that applies.
"""

from __future__ import annotations


__all__ = ["ANALYSIS_FIGURES", "HEADLINE", "analysis_key", "analysis_keys", "analysis_record"]

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
    ("sample_voxels", None),
)

#: The figures that are columns of ``ctpore batch``'s summary.
HEADLINE = ("specific_surface", "thickness_d50", "connected_porosity", "percolating_porosity_zyx")

_SUFFIX = {"length": ("_mm", "_voxel"), "area": ("_mm2", "_voxel2"), "per_length": ("_per_mm", "_per_voxel")}


def analysis_key(figure: str, kind, known: bool) -> str:
    """The key of ``figure`` in the record, with the unit suffix that applies."""
    if kind is None:
        return figure
    return figure + _SUFFIX[kind][0 if known else 1]


def analysis_keys() -> list[tuple[str, str]]:
    """``(key, figure)`` for every key a record may hold (both units of a figure with a length),
    the metrics' own ``porosity``, ``euler_number`` and ``sample_voxels`` included."""
    return [(analysis_key(f, kind, known), f) for f, kind in ANALYSIS_FIGURES
            for known in ((True, False) if kind else (True,))]


def analysis_record(result: dict) -> dict:
    """The figures of ``result`` under their keys, in :data:`ANALYSIS_FIGURES`' order."""
    known = bool(result.get("units_known", True))
    return {analysis_key(f, kind, known): result.get(f) for f, kind in ANALYSIS_FIGURES}
