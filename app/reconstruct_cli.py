"""``ctpore reconstruct``: the 3D pores of scans, written as files. Registered on the ``ctpore`` group
by :mod:`ctpore.app.cli`; thin like every command: parse, call a pipeline, print."""

from __future__ import annotations

import logging

from pathlib import Path

import click

from ctpore.app.console import EXIT_INPUT, EXIT_OK
from ctpore.app.console import GPU_MEMORY_DEFAULT as _GPU_MEMORY_DEFAULT
from ctpore.app.console import SHOWN_DEFAULTS as _SHOWN_DEFAULTS
from ctpore.app.console import SLICE_AXIS_HELP as _SLICE_AXIS_HELP
from ctpore.app.console import Progress as _Progress
from ctpore.app.console import error as _error
from ctpore.app.console import method_choice as _method_choice
from ctpore.app.console import method_help as _method_help
from ctpore.app.console import option as _option
from ctpore.app.console import output_format_option as _output_format_option
from ctpore.app.console import reconstruct_default as _rdefault
from ctpore.app.console import sample_margin_option as _sample_margin_option
from ctpore.app.console import tmp_dir_option as _tmp_dir_option
from ctpore.errors import InputError

__all__ = ["reconstruct"]


@click.command()
@click.argument("scans", nargs=-1, required=True, type=click.Path(path_type=Path))
@_option("-o", "--outdir", required=True, type=click.Path(path_type=Path),
         help="Output folder (created if missing).")
@_option("--method", default=lambda: _rdefault("method"), show_default=_SHOWN_DEFAULTS["method"],
         type=_method_choice(), help=_method_help())
@_option("--weights", type=click.Path(path_type=Path), default=None, show_default="the shipped weights",
         help="The method's weights (.safetensors), for the learned methods.")
@_option("--slice-axis", type=click.IntRange(0, 2), default=None, show_default="2, the third axis",
         help=_SLICE_AXIS_HELP)
@_option("--truth", type=click.Path(path_type=Path), default=None, show_default="none",
         help="Ground-truth pores (1 = pore) to add MSE, Dice and Euler error to the metrics (one SCAN only).")
@_option("--overwrite", is_flag=True, show_default=True,
         help="Replace existing outputs. Without it a scan whose outputs exist is refused and its files kept.")
@_option("--device", default=lambda: _rdefault("device"), show_default=_SHOWN_DEFAULTS["device"],
         help="cpu, cuda, cuda:1, ... (PoreFormer only).")
@_option("--memory-gb", default=lambda: _rdefault("memory_gb"), show_default=_SHOWN_DEFAULTS["memory_gb"],
         type=click.FloatRange(0.25),
         help="Host memory budget of the whole PoreFormer run (GB): tiles and chunks follow from it (on CPU).")
@_option("--gpu-memory-gb", default=None, type=click.FloatRange(0.25), show_default=_GPU_MEMORY_DEFAULT,
         help="On CUDA, the most GPU memory (GB) tiles and chunks may take; --memory-gb still bounds the host.")
@_option("--chunk-slices", default=None, type=click.IntRange(1), show_default="the fastest that fits --memory-gb",
         help="Slices per streamed chunk.")
@_option("--tile", default=None, type=click.IntRange(8), show_default="the fastest that fits --memory-gb",
         help="In-plane tile size (pixels).")
@_option("--precision", default=lambda: _rdefault("precision"), show_default=_SHOWN_DEFAULTS["precision"],
         type=click.Choice(["auto", "fp32", "bf16", "fp16"]),
         help="auto = bf16 on CUDA (so FlashAttention runs) and on CPUs that multiply bf16 natively "
              "(AVX512-BF16, AMX), else fp32; fp32 = the stored model as it is.")
@_option("--attention-backend", default=None, type=click.Choice(["auto", "flash", "sdpa", "math"]),
         show_default="the one stored with the weights",
         help="Override the weights' attention backend (the metrics report the one that ran).")
@_option("--min-pore-voxels", default=None, type=click.IntRange(0), show_default="off",
         help="Also remove pore components smaller than this many voxels (a size rule of your own, on top of "
              "the method's post-processing; recorded in the metrics).")
@_option("--sample", default="auto", show_default=True,
         help="Which voxels are the sample: auto (find it by its shape: a cylinder fitted to a core's surface, "
              "a container's wall and the air around left out, or a block's outline; every figure is of the "
              "sample only), all (every voxel), or a mask file (1 = sample) of the scan's shape and affine.")
@_sample_margin_option
@_tmp_dir_option
@_output_format_option
@_option("--analyze", is_flag=True, show_default=True,
         help="Also write what ctpore analyze writes of the pores (<stem>_analysis.json, the thickness map, the "
              "pore-size table and plot); its figures go in the metrics too.")
@_option("--flow", is_flag=True, show_default=True,
         help="Also the permeability and tortuosity per axis (as ctpore analyze --flow) on the largest cube up to "
              "200^3 inside the sample that fits --memory-gb (needs the analysis extra); implies --analyze.")
@_option("--workers", default=None, type=click.IntRange(1), show_default="one process",
         help="Split each scan into Z-slabs across a local Dask cluster of this many workers (PoreFormer; the "
              "same voxels and metrics as one process; OME-Zarr outputs unless --output-format nifti is given, "
              "which the driver then writes in one serial pass). See docs/scale.md.")
@_option("--scheduler", default=None, show_default="one process",
         help="Split each scan into Z-slabs across the workers of a running Dask scheduler (tcp://host:8786); "
              "the workers must see the scan and OUTDIR at the same paths.")
@_option("--slab-slices", default=None, type=click.IntRange(1), show_default="8 x the model's reach along Z",
         help="With --workers or --scheduler: slices per slab (rounded up to the outputs' chunk alignment).")
def reconstruct(scans, outdir, method, weights, slice_axis, truth, overwrite, device, memory_gb, gpu_memory_gb,
                chunk_slices, tile, precision, attention_backend, min_pore_voxels, sample, sample_margin, tmp_dir,
                output_format, analyze, flow, workers, scheduler, slab_slices):
    """Reconstruct the 3D pores of SCANS (NIfTI, TIFF, HDF, MetaImage, NRRD or OME-Zarr files, or folders of slices).

    Writes OUTDIR/<stem>_pores.nii.gz (1 = pore), <stem>_prob.nii.gz (pore probability) and
    <stem>_metrics.json per scan (with --output-format ome-zarr: <stem>_pores.ome.zarr and
    <stem>_prob.ome.zarr, multiscale).

    Existing outputs are kept unless --overwrite is given: such a scan is refused with a message
    and the other scans go on. Every file is written whole or not at all (a temporary file, then
    a rename), the metrics file last, so a metrics file means a complete set. A scan is refused
    before any work when the disk cannot hold what its run writes (checked in OUTDIR and
    --tmp-dir), or while another run writes the same outputs.

    Memory: the whole process is bounded by --memory-gb (default 1.5 GB): the scan is streamed
    from disk slab by slab, and a larger budget allows larger tiles and chunks. The U-Net
    baselines hold the whole scan in memory, whatever --memory-gb says. Time grows with the
    number of voxels (slices x rows x columns); with a CUDA GPU, use --device cuda: the tiles
    then follow the GPU's free memory (at most --gpu-memory-gb) and --memory-gb bounds the host
    (CUDA's libraries count in it). See docs/performance.md for measured figures.

    Split runs (--workers N or --scheduler ADDRESS) cut each scan in turn into Z-slabs computed on
    the Dask workers, with the same voxels and metrics as one process; a rerun after the driver
    died computes only the slabs it had not finished (docs/scale.md).

    Exit codes: 0 done; 2 bad input or usage (one line on stderr per bad scan, naming the file);
    1 internal error (ctpore batch: 3 when some scans failed).
    """
    from ctpore.pipelines.reconstruct import reconstruct_file

    if truth is not None and len(scans) > 1:
        raise InputError("--truth applies to a single scan; give one SCAN with it")
    split = workers is not None or scheduler is not None
    if split:
        given = click.get_current_context().get_parameter_source("output_format")
        output_format = _split_checks(method, truth, analyze or flow, sample, tmp_dir, gpu_memory_gb, output_format,
                                      given == click.core.ParameterSource.DEFAULT)
        client, cluster = _split_cluster(scheduler, workers)
    elif slab_slices is not None:
        raise InputError("--slab-slices applies to a split run: give --workers N or --scheduler ADDRESS with it")
    failed = 0
    for scan in scans:
        try:
            with _Progress(scan.name) as bar:
                if split:
                    from ctpore.pipelines.split import reconstruct_split

                    out = reconstruct_split(
                        scan, outdir, client, weights=weights, device=device, slice_axis=slice_axis,
                        memory_gb=memory_gb, precision=precision, attention_backend=attention_backend,
                        min_pore_voxels=min_pore_voxels, sample=sample, sample_margin=sample_margin,
                        overwrite=overwrite, slab_slices=slab_slices, chunk_slices=chunk_slices, tile=tile,
                        progress=bar, output_format=output_format)
                else:
                    out = reconstruct_file(
                    scan, outdir, method, overwrite=overwrite, weights=weights, device=device,
                    slice_axis=slice_axis, truth=truth, chunk_slices=chunk_slices, tile=tile, progress=bar,
                    memory_gb=memory_gb, precision=precision, attention_backend=attention_backend,
                    min_pore_voxels=min_pore_voxels, gpu_memory_gb=gpu_memory_gb,
                    sample=sample if sample in ("auto", "all") else Path(sample), tmp_dir=tmp_dir,
                    output_format=output_format, sample_margin=sample_margin, analyze=analyze, flow=flow,
                )
        except InputError as exc:
            _error(str(exc))
            failed += 1
            continue
        m = out["result"]
        line = (f"{scan} -> {out['pores']}  porosity {m['porosity']:.4f}  Euler {m['euler_number']}"
                f"  pores {m['n_pores']}  [{m['method']}, {m['seconds']:.1f} s]")
        if "dice" in m:
            line += f"  Dice {m['dice']:.4f}  MSE {m['mse']:.5f}"
        if analyze or flow:
            unit = "mm" if "thickness_d50_mm" in m else "voxel"
            line += (f"  d50 {m.get(f'thickness_d50_{unit}')} {unit}  connected {m.get('connected_porosity', 0):.4f}")
            if m.get("porosity_range"):  # over the calibrated probability's levels 0.3 to 0.7
                lo, hi = m["porosity_range"]
                line += f"  porosity {lo:.4f}-{hi:.4f} at p 0.3-0.7"
        if flow:  # the permeability along Z (the flow's cube in the record)
            k = m.get("permeability_zyx_darcy") or m.get("permeability_zyx_voxel2") or [None]
            unit = "D" if "permeability_zyx_darcy" in m else "voxel^2"
            line += f"  k_z {k[0]:.4g} {unit}" if k[0] is not None else "  k_z -"
        click.echo(line)
    if split:
        client.close()
        if cluster is not None:
            cluster.close()
    return EXIT_INPUT if failed else EXIT_OK


def _split_checks(method, truth, analyze, sample, tmp_dir, gpu_memory_gb, output_format, default_format) -> str:
    """What a split run takes (the output format it writes: OME-Zarr, the stores its slabs write, unless
    --output-format nifti is given), or an InputError naming what it does not."""
    no = [(method not in ("auto", "poreformer"), f"--method {method} (PoreFormer alone is split: its reach along Z "
                                                  "is known)"),
          (truth is not None, "--truth"), (analyze, "--analyze or --flow (run ctpore analyze on its pores)"),
          (sample not in ("auto", "all"), "--sample MASK"), (tmp_dir is not None, "--tmp-dir (its work folder is "
                                                                                  "beside the outputs, shared)"),
          (gpu_memory_gb is not None, "--gpu-memory-gb")]
    bad = [what for cond, what in no if cond]
    if bad:
        raise InputError("a split run (--workers or --scheduler) does not take " + "; ".join(bad)
                         + "; run those in one process")
    return "ome-zarr" if default_format else output_format  # OME-Zarr unless NIfTI is asked for


def _split_cluster(scheduler, workers):
    from ctpore.pipelines.batch_cluster import require_cluster, start_cluster

    require_cluster()
    # the workers' own logs stay quiet: a slab's failure comes back to this process, which says it in one line
    client, cluster, _gpu = start_cluster(scheduler, workers or 2, 1, retries=3, log_level=logging.CRITICAL)
    return client, cluster
