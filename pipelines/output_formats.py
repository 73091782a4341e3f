"""The output formats of a reconstruction: the one table every entry reads (the command's
``--output-format``, the pipeline, batch, napari's layers, the disk estimate).

A new output format is one line here and a writer (:func:`ctpore.data.io.write.volume_writer`
chooses by the output's suffix). This module imports nothing heavy, so the command line reads it
to offer its choices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["DEFAULT_OUTPUT_FORMAT", "OUTPUT_FORMATS", "OutputFormat"]


@dataclass(frozen=True)
class OutputFormat:
    """One output format: the suffix of its volume outputs, the optional library it needs
    (checked before any work, rather than when the first slab is written), and whether it is
    written in the input file's axis order (so that, when z is not the file's slowest axis, the
    slabs wait on disk until the end: the disk estimate counts them)."""

    suffix: str
    label: str
    library: Optional[str] = None
    file_axis_order: bool = False


#: Output format -> how it is written (NIfTI is the default; OME-Zarr for scans that NIfTI tools
#: handle badly, above a few GB: multiscale, opened lazily by napari).
OUTPUT_FORMATS = {
    "nifti": OutputFormat(".nii.gz", "NIfTI", file_axis_order=True),
    "ome-zarr": OutputFormat(".ome.zarr", "OME-Zarr", library="zarr"),
}

#: The format a run writes unless told otherwise.
DEFAULT_OUTPUT_FORMAT = "nifti"
