"""Folders of 2D image slices: PNG, BMP, JPEG (one file a slice, in natural order), through Pillow.

Every file's header is read when the folder is opened (all slices must share one shape and one
grayscale mode: 8-bit ``L``, 16-bit ``I;16``, 32-bit ``I``/``F``, or 1-bit); colour and palette
images are refused. The sizes a header describes are checked against the file before its pixels
are decoded: a PNG's rows cannot take more than deflate's 1032:1 of its bytes, an uncompressed BMP
must hold its rows. These formats carry no voxel size: spacing 1, units ``"unknown"``.
"""

from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from ctpore.data.io.formats import (
    DEFLATE_MAX_RATIO,
    check_3d,
    check_grayscale_dtype,
    deflate_limit,
    natural_key,
    reason,
    size_text,
    truncated_error,
)
from ctpore.data.io.geometry import Geometry
from ctpore.data.io.reader import PlaneReader
from ctpore.errors import InputError

__all__ = ["ImageFolderReader", "PngFolderReader", "BmpFolderReader", "JpegFolderReader"]

# Pillow's grayscale modes -> the voxel type np.asarray gives.
_MODES = {"1": np.dtype(bool), "L": np.dtype(np.uint8), "I;16": np.dtype("<u2"), "I;16L": np.dtype("<u2"),
          "I;16B": np.dtype(">u2"), "I": np.dtype(np.int32), "F": np.dtype(np.float32)}


_PIL_LOCK = threading.Lock()


@contextmanager
def _pil() -> Iterator:
    """Pillow's ``Image`` with its decompression-bomb limit lifted (a CT slice may pass its 179
    megapixels; the sizes are checked against the file here instead), restored afterwards."""
    from PIL import Image  # a dependency of ctpore (scikit-image needs it too)

    with _PIL_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
        try:
            yield Image
        finally:
            Image.MAX_IMAGE_PIXELS = limit


class ImageFolderReader(PlaneReader):
    """A folder of single-slice image files with one of :attr:`SUFFIXES`, in natural order."""

    SUFFIXES: tuple[str, ...] = ()
    FORMAT = ""  # Geometry.format, and the name in messages (upper case)

    def __init__(self, path: Path):
        self.path = Path(path)
        label = self.FORMAT.upper()
        try:
            files = [p for p in self.path.iterdir() if p.is_file() and not p.name.startswith(".")
                     and p.name.lower().endswith(self.SUFFIXES)]
        except OSError as exc:
            raise InputError(f"cannot list the folder ({reason(exc)})", self.path) from exc
        if not files:
            raise InputError(f"the folder holds no {'/'.join(self.SUFFIXES)} slices", self.path)
        self.files = sorted(files, key=lambda p: natural_key(p.name))
        first: tuple[tuple[int, int], str] | None = None
        for f in self.files:
            size = f.stat().st_size
            if size == 0:
                raise InputError(f"slice file {f.name} is empty (0 bytes)", self.path)
            try:
                with _pil() as Image, Image.open(f) as im:
                    mode, (w, h) = im.mode, im.size
                    frames = int(getattr(im, "n_frames", 1))
                    compression = im.info.get("compression", 0)
            except MemoryError:
                raise
            except Exception as exc:
                raise InputError(f"slice file {f.name} is not a readable {label} image ({reason(exc)})",
                                 self.path) from exc
            if mode not in _MODES:
                what = "a palette (indexed colour)" if mode == "P" else f"a colour ({mode})"
                raise InputError(f"slice file {f.name} is {what} image; ctpore needs grayscale slices", self.path)
            if frames != 1:
                raise InputError(f"slice file {f.name} holds {frames} images; each file of a slice folder must "
                                 "hold one 2D slice", self.path)
            self._check_size(f, size, h, w, mode, compression)
            if first is None:
                first = ((h, w), mode)
            elif ((h, w), mode) != first:
                raise InputError(f"slice file {f.name} is {h} x {w} {mode} but {self.files[0].name} is "
                                 f"{first[0][0]} x {first[0][1]} {first[1]}; every slice must have the same shape "
                                 "and type", self.path)
        (h, w), mode = first  # type: ignore[misc]
        self.mode = mode
        self.dtype = _MODES[mode]
        check_grayscale_dtype(self.dtype, self.path)
        shape = (len(self.files), h, w)
        check_3d(shape, self.path, shape)
        self.geometry = Geometry(format=self.FORMAT, shape=shape, spacing_mm=(1.0, 1.0, 1.0), slice_axis=0,
                                 file_shape=shape, permutation=(0, 1, 2), units="unknown")

    def _check_size(self, f: Path, size: int, h: int, w: int, mode: str, compression: object) -> None:
        """Refuse a header describing more pixels than the file can hold (per format; none here)."""

    def read(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((max(0, stop - start),) + self.geometry.shape[1:], self.dtype)  # (n, Y, X)
        for i in range(start, stop):
            f = self.files[i]
            try:
                with _pil() as Image, Image.open(f) as im:
                    data = np.asarray(im)
            except MemoryError:
                raise
            except Exception as exc:
                raise InputError(f"slice file {f.name} cannot be read ({reason(exc)})", self.path) from exc
            if data.shape != self.geometry.shape[1:]:
                raise InputError(f"slice file {f.name} has shape {data.shape}, expected {self.geometry.shape[1:]}",
                                 self.path)
            out[i - start] = data
        return out

    def close(self) -> None:
        pass


def _row_bytes(w: int, mode: str) -> int:
    bits = {"1": 1, "L": 8, "I": 32, "F": 32}.get(mode, 16)
    return (w * bits + 7) // 8


class PngFolderReader(ImageFolderReader):
    """A folder of PNG slices."""

    SUFFIXES = (".png",)
    FORMAT = "png"

    def _check_size(self, f: Path, size: int, h: int, w: int, mode: str, compression: object) -> None:
        """The rows (each with its filter byte) cannot exceed what the deflate data expands to."""
        if h * (_row_bytes(w, mode) + 1) > deflate_limit(size):
            raise truncated_error(self.path, f"slice file {f.name}", (h, w), _MODES[mode], h * _row_bytes(w, mode),
                                  f"its {size_text(size)} of deflate data can expand to at most "
                                  f"{size_text(deflate_limit(size))} "
                                  f"(deflate compresses at most {DEFLATE_MAX_RATIO}:1)")


class BmpFolderReader(ImageFolderReader):
    """A folder of BMP slices."""

    SUFFIXES = (".bmp",)
    FORMAT = "bmp"

    def _check_size(self, f: Path, size: int, h: int, w: int, mode: str, compression: object) -> None:
        """Uncompressed rows (padded to 4 bytes) must fit in the file."""
        need = h * ((_row_bytes(w, mode) + 3) // 4 * 4)
        if compression == 0 and need > size:
            raise truncated_error(self.path, f"slice file {f.name}", (h, w), _MODES[mode], need,
                                  f"{f.name} holds {size_text(size)}")


class JpegFolderReader(ImageFolderReader):
    """A folder of JPEG slices (lossy: prefer PNG or TIFF when there is the choice)."""

    SUFFIXES = (".jpg", ".jpeg")
    FORMAT = "jpeg"
