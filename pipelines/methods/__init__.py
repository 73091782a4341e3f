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
from typing import Any, Callable, Optional, Protocol, runtime_checkable

from ctpore.data.postprocess import Postprocessing
from ctpore.errors import InputError
from ctpore.progress import ProgressFn

__all__ = ["AUTO", "MethodSpec", "Predictor", "Untiled", "METHODS", "register_method", "get_method", "method_names",
           "resolve_method", "trainable_names", "bench_names"]

#: The method name that picks PoreFormer when its weights are installed, else the Fiji pipeline.
AUTO = "auto"


@runtime_checkable
class Predictor(Protocol):
    """A method ready to run (its weights loaded), as :func:`MethodSpec.factory` builds it: what
    :func:`~ctpore.pipelines.reconstruct.run_reconstruction` and the disk estimate read of it, and
    nothing more (a test checks every registered factory's object against it).

    Attributes
    ----------
    name : str
        The method's registered name.
    post : Postprocessing
        What turns its raw probabilities into pores (for a thresholding method: ``binary``).
    info : dict
        What the metrics record about it: ``model`` ({"name", "sha256"}), ``device``,
        ``attention_backend`` (None where there is none).
    device : str or torch.device
        Where it runs (``"cpu"``, ``cuda:0``): the memory plan keeps more back for a CUDA process.
    halo : int or None
        A predictor that works in in-plane tiles reads this many pixels around each tile (so a
        scan that cannot read windows is copied once when a plane takes several tiles); None: it
        does not tile.
    """

    name: str
    post: Postprocessing
    info: dict
    device: Any
    halo: Optional[int]

    def plan(self, shape: tuple[int, int, int], budget_bytes: float, gpu_memory_gb: Optional[float] = None,
             precision: str = "auto") -> Optional[tuple[int, int]]:
        """Its ``(tile, chunk_slices)`` for a scan of ``shape`` within ``budget_bytes`` of host
        memory (and, on CUDA, ``gpu_memory_gb``); None: it has no such settings."""

    def predict(self, volume: Any, out: Any, *, budget_bytes: float, progress: ProgressFn = None,
                chunk_slices: Optional[int] = None, tile: Optional[int] = None, precision: str = "auto") -> dict:
        """Write the raw pore probabilities of ``volume`` into ``out``; return extra run info.

        ``volume`` is the normalized scan: ``.shape`` (Z, Y, X), ``volume[z0:z1]`` and
        ``volume.read_window(z0, z1, y0, y1, x0, x1)`` give float32 slices. ``out`` takes blocks:
        ``out[z0:z1, y0:y1, x0:x1] = block`` (a numpy array, or a volume spilled to disk).
        ``budget_bytes`` is the memory its working set may take; ``tile`` and ``chunk_slices``
        are those of :meth:`plan` unless the user set them; ``precision`` is ``auto``, ``fp32`` or
        ``bf16`` (a method without a lower precision ignores it).
        """


class Untiled:
    """A base for a predictor that neither tiles nor plans (a threshold, a model that holds the whole
    scan): ``halo`` None, :meth:`plan` None, on the CPU unless it sets ``device``."""

    halo = None
    device: Any = "cpu"

    def plan(self, shape: tuple[int, int, int], budget_bytes: float, gpu_memory_gb: Optional[float] = None,
             precision: str = "auto") -> None:
        """None: no tile and no chunk of its own to plan."""
        return None


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
    bench_column : int, optional
        Its column in ``ctpore bench quality`` (lowest first: the simplest method on the left);
        None: the benchmark does not set it beside the others.
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
    bench_column: Optional[int] = None


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


def bench_names() -> tuple[str, ...]:
    """The methods ``ctpore bench quality`` sets side by side, in their columns' order."""
    chosen = [s for s in METHODS.values() if s.bench_column is not None]
    return tuple(s.name for s in sorted(chosen, key=lambda s: s.bench_column))


def trainable_names() -> list[str]:
    """The methods ``ctpore train`` can train (a training config's ``model``)."""
    return [n for n, s in METHODS.items() if s.trainable]


def _builtin() -> None:
    from ctpore.pipelines.methods.classical import fiji_pipeline, plain_otsu
    from ctpore.pipelines.methods.learned import poreformer, poreformer_network, unet, unet_network

    for spec in (
        MethodSpec("poreformer", "PoreFormer", "causal inter-slice attention network (the shipped model)",
                   poreformer, weights="poreformer.safetensors", trainable=True, network=poreformer_network,
                   bench_column=4),
        MethodSpec("unet3d", "3D U-Net (MONAI)", "a 3D U-Net baseline trained like PoreFormer",
                   lambda **kw: unet("unet3d", **kw), weights="unet3d.safetensors", trainable=True,
                   network=lambda cfg: unet_network("unet3d", cfg), bench_column=3),
        MethodSpec("unet2d", "2D U-Net, slice by slice (MONAI)", "a 2D U-Net baseline applied slice by slice",
                   lambda **kw: unet("unet2d", **kw), weights="unet2d.safetensors", trainable=True,
                   network=lambda cfg: unet_network("unet2d", cfg), bench_column=2),
        MethodSpec("otsu", "Filtered Otsu (median + Otsu + specks, Fiji)",
                   "the Fiji pipeline: 3x3x3 median, global Otsu, removal of specks under 10 voxels",
                   fiji_pipeline, aliases=("filtered_otsu",), bench_column=1),
        MethodSpec("plain-otsu", "Otsu", "a bare global Otsu threshold", plain_otsu, bench_column=0),
    ):
        register_method(spec)


_builtin()
