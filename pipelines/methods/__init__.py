"""The methods that turn a scan into pore probabilities, by name: one registry every entry reads.

``ctpore reconstruct --method``, the napari dropdowns, ``ctpore batch``, ``ctpore train`` and
``ctpore bench`` all take their names, descriptions and defaults from :data:`METHODS`. A method is a
:class:`MethodSpec` whose ``factory`` builds a :class:`Predictor`; the one reconstruct pipeline
(:mod:`ctpore.pipelines.reconstruct`) runs any predictor the same way: it normalizes the scan, asks
the predictor for raw pore probabilities (written into a volume on disk or in memory), applies the
predictor's :class:`~ctpore.data.postprocess.Postprocessing` slab by slab, writes or returns the
outputs and measures them.

Adding a method is one module (its predictor) and one :func:`register_method` line.

Examples
--------
>>> sorted(method_names())
['otsu', 'plain-otsu', 'poreformer', 'unet2d', 'unet3d']
>>> get_method("filtered_otsu").name          # the benchmark's older name for the Fiji pipeline
'otsu'
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

from ctpore.data.postprocess import Postprocessing
from ctpore.errors import InputError
from ctpore.progress import ProgressFn

__all__ = ["AUTO", "MethodSpec", "Predictor", "METHODS", "register_method", "get_method", "method_names",
           "resolve_method", "trainable_names"]

#: The method name that picks PoreFormer when its weights are installed, else the Fiji pipeline.
AUTO = "auto"


class Predictor(Protocol):
    """A method ready to run (its weights loaded), as :func:`MethodSpec.factory` builds it.

    Attributes
    ----------
    name : str
        The method's registered name.
    post : Postprocessing
        What turns its raw probabilities into pores (for a thresholding method: ``binary``).
    info : dict
        What the metrics record about it: ``model`` ({"name", "sha256"}), ``device``,
        ``attention_backend`` (None where there is none).
    streams : bool
        True: :meth:`predict` reads the scan window by window and its memory does not grow with
        the scan; False: it holds the whole (normalized) scan in memory.
    """

    name: str
    post: Postprocessing
    info: dict
    streams: bool

    def predict(self, volume: Any, out: Any, *, budget_bytes: float, progress: ProgressFn = None,
                chunk_slices: Optional[int] = None, tile: Optional[int] = None) -> dict:
        """Write the raw pore probabilities of ``volume`` into ``out``; return extra run info.

        ``volume`` is the normalized scan: ``.shape`` (Z, Y, X), ``volume[z0:z1]`` and
        ``volume.read_window(z0, z1, y0, y1, x0, x1)`` give float32 slices. ``out`` takes blocks:
        ``out[z0:z1, y0:y1, x0:x1] = block`` (a numpy array, or a volume spilled to disk).
        ``budget_bytes`` is the memory its working set may take.
        """


@dataclass(frozen=True)
class MethodSpec:
    """A method of the registry.

    Attributes
    ----------
    name : str
        The name users type (``--method``).
    label : str
        How reports name it.
    description : str
        One line for help texts and tooltips.
    factory : callable
        ``factory(weights=None, device="cpu", attention_backend=None) -> Predictor``.
    weights : str, optional
        File name of its shipped weights in ``models/weights`` (None: it has none).
    trainable : bool
        ``ctpore train`` can train it (its name is a training config's ``model``).
    aliases : tuple of str
        Older names that still select it.
    defaults : dict
        Its own default settings, shown in help.
    network : callable, optional
        ``network(model_config) -> torch.nn.Module``: a freshly initialised network, for a
        trainable method (a training config's ``model_config``).
    """

    name: str
    label: str
    description: str
    factory: Callable[..., Predictor] = field(compare=False)
    weights: Optional[str] = None
    trainable: bool = False
    aliases: tuple = ()
    defaults: dict = field(default_factory=dict, compare=False)
    network: Optional[Callable[[dict], Any]] = field(default=None, compare=False)


#: Every method, by name, in the order the help and the benchmark list them.
METHODS: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec) -> MethodSpec:
    """Add (or replace) a method in :data:`METHODS`."""
    if not spec.name or spec.name == AUTO or spec.name != spec.name.strip():
        raise ValueError(f"a method needs a plain name other than {AUTO!r}, got {spec.name!r}")
    METHODS[spec.name] = spec
    return spec


def method_names(auto: bool = False) -> list[str]:
    """The registered names (with ``auto`` first when asked: the choices of ``--method``)."""
    return ([AUTO] if auto else []) + list(METHODS)


def get_method(name: str) -> MethodSpec:
    """The method called ``name`` (or one of its aliases); an InputError lists the choices."""
    if name in METHODS:
        return METHODS[name]
    for spec in METHODS.values():
        if name in spec.aliases:
            return spec
    raise InputError(f"unknown method {name!r}; choose one of {', '.join(method_names(auto=True))}")


def resolve_method(method: str, weights: Optional[str | os.PathLike] = None) -> str:
    """Turn ``auto`` into a concrete method name (PoreFormer when weights are given or installed,
    else the Fiji pipeline ``otsu``); check any other name."""
    if method != AUTO:
        return get_method(method).name
    from ctpore.models.weights import default_weights_path

    return "poreformer" if (weights is not None or default_weights_path() is not None) else "otsu"


def trainable_names() -> list[str]:
    """The methods ``ctpore train`` can train (a training config's ``model``)."""
    return [n for n, s in METHODS.items() if s.trainable]


def _builtin() -> None:
    from ctpore.pipelines.methods.classical import fiji_pipeline, plain_otsu
    from ctpore.pipelines.methods.learned import poreformer, poreformer_network, unet, unet_network

    for spec in (
        MethodSpec("poreformer", "PoreFormer", "causal inter-slice attention network (the shipped model)",
                   poreformer, weights="poreformer.safetensors", trainable=True, network=poreformer_network),
        MethodSpec("unet3d", "3D U-Net (MONAI)", "a 3D U-Net baseline trained like PoreFormer",
                   lambda **kw: unet("unet3d", **kw), weights="unet3d.safetensors", trainable=True,
                   network=lambda cfg: unet_network("unet3d", cfg)),
        MethodSpec("unet2d", "2D U-Net, slice by slice (MONAI)", "a 2D U-Net baseline applied slice by slice",
                   lambda **kw: unet("unet2d", **kw), weights="unet2d.safetensors", trainable=True,
                   network=lambda cfg: unet_network("unet2d", cfg)),
        MethodSpec("otsu", "Filtered Otsu (median + Otsu + specks, Fiji)",
                   "the Fiji pipeline: 3x3x3 median, global Otsu, removal of specks under 10 voxels",
                   fiji_pipeline, aliases=("filtered_otsu",)),
        MethodSpec("plain-otsu", "Otsu", "a bare global Otsu threshold", plain_otsu, aliases=()),
    ):
        register_method(spec)


_builtin()
