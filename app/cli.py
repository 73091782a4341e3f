"""The ``ctpore`` command. Thin: parse, call a pipeline, print.

Exit codes: 0 done; 2 bad input or usage (one line on stderr naming the file and what is wrong);
1 internal error; ``batch``: 3 when some scans failed and the rest were done.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import click

from ctpore.version import __version__
from ctpore.app.attention_cli import attention
from ctpore.app.bench_cli import bench
from ctpore.app.console import GPU_MEMORY_DEFAULT as _GPU_MEMORY_DEFAULT
from ctpore.app.console import SLICE_AXIS_HELP as _SLICE_AXIS_HELP
from ctpore.app.console import Progress as _Progress
from ctpore.app.console import check_device as _check_device
from ctpore.app.console import error as _error
from ctpore.app.console import option as _option
from ctpore.app.console import resource_error as _resource_error
from ctpore.app.console import show_warning as _show_warning
from ctpore.app.console import output_format_option as _output_format_option
from ctpore.app.console import sample_margin_option as _sample_margin_option
from ctpore.app.console import tmp_dir_option as _tmp_dir_option
from ctpore.app.console import warn as _warn
from ctpore.errors import InputError
from ctpore.runtime import tune_allocator

EXIT_OK, EXIT_INTERNAL, EXIT_INPUT, EXIT_PARTIAL = 0, 1, 2, 3


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ctpore")
def cli() -> None:
    """ctpore: the 3D pore space of soil and rock from X-ray micro-CT scans.

    Exit codes of every command: 0 done; 2 bad input or usage (one line on stderr that names the
    file and what is wrong); 1 internal error; batch: 3 when some scans failed and the rest were done.
    """


cli.add_command(attention)  # app/attention_cli.py
cli.add_command(bench)  # app/bench_cli.py


def _rdefault(key):
    from ctpore.pipelines.reconstruct import DEFAULTS

    return DEFAULTS[key]


#: The defaults of configs/reconstruct.yaml as --help shows them (tests check they agree).
_SHOWN_DEFAULTS = {"method": "auto", "device": "cpu", "memory_gb": "1.5", "precision": "auto"}


class _MethodChoice(click.Choice):
    """``--method``'s choices: ``auto`` and every registered method (and their older names), read
    from the registry when the command runs, so a method registered after import is a choice too."""

    def __init__(self):
        super().__init__([])

    @property
    def choices(self):
        from ctpore.pipelines.methods import METHODS, method_names

        return tuple(method_names(auto=True) + [a for s in METHODS.values() for a in s.aliases])

    @choices.setter
    def choices(self, value):
        pass


def _method_choice() -> click.Choice:
    return _MethodChoice()


def _method_help() -> str:
    from ctpore.pipelines.methods import METHODS

    return ("auto = poreformer when its weights are installed, else otsu. "
            + "; ".join(f"{s.name}: {s.description}" for s in METHODS.values()) + ".")


@cli.command()
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
def reconstruct(scans, outdir, method, weights, slice_axis, truth, overwrite, device, memory_gb, gpu_memory_gb,
                chunk_slices, tile, precision, attention_backend, min_pore_voxels, sample, sample_margin, tmp_dir,
                output_format):
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

    Exit codes: 0 done; 2 bad input or usage (one line on stderr per bad scan, naming the file);
    1 internal error (ctpore batch: 3 when some scans failed).
    """
    from ctpore.pipelines.reconstruct import reconstruct_file

    if truth is not None and len(scans) > 1:
        raise InputError("--truth applies to a single scan; give one SCAN with it")
    failed = 0
    for scan in scans:
        try:
            with _Progress(scan.name) as bar:
                out = reconstruct_file(
                    scan, outdir, method, overwrite=overwrite, weights=weights, device=device,
                    slice_axis=slice_axis, truth=truth, chunk_slices=chunk_slices, tile=tile, progress=bar,
                    memory_gb=memory_gb, precision=precision, attention_backend=attention_backend,
                    min_pore_voxels=min_pore_voxels, gpu_memory_gb=gpu_memory_gb,
                    sample=sample if sample in ("auto", "all") else Path(sample), tmp_dir=tmp_dir,
                    output_format=output_format, sample_margin=sample_margin,
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
        click.echo(line)
    return EXIT_INPUT if failed else EXIT_OK


@cli.command()
@click.argument("manifest", type=click.Path(path_type=Path))
@_option("-o", "--outdir", required=True, type=click.Path(path_type=Path),
         help="Output folder: each scan's outputs as for reconstruct, batch_report.jsonl and batch_summary.csv.")
@_option("--scheduler", default=None, show_default="a local cluster on 127.0.0.1",
         help="Address of a running Dask scheduler (tcp://host:8786).")
@_option("--workers", default=2, show_default=True, type=click.IntRange(1),
         help="Worker processes of the local cluster (CPU; with CUDA one per GPU).")
@_option("--gpus-per-worker", default=1, show_default=True, type=click.IntRange(1),
         help="GPUs each worker of a local CUDA cluster holds (without dask-cuda).")
@_option("--retries", default=2, show_default=True, type=click.IntRange(0),
         help="Times a scan is tried again when its worker dies (never for bad input).")
@_option("--part", default=None, show_default="the whole manifest",
         help="Do only share I/N of the manifest (every N-th scan from the I-th), for job arrays.")
@_option("--method", default="auto", show_default=True, type=_method_choice(), help="As for reconstruct.")
@_option("--weights", type=click.Path(path_type=Path), default=None, show_default="the shipped weights",
         help="The method's weights (.safetensors), for the learned methods.")
@_option("--memory-gb", default=lambda: _rdefault("memory_gb"), show_default=_SHOWN_DEFAULTS["memory_gb"],
         type=click.FloatRange(0.25), help="Memory budget of each worker's scan (GB), as reconstruct's.")
@_option("--gpu-memory-gb", default=None, type=click.FloatRange(0.25), show_default=_GPU_MEMORY_DEFAULT,
         help="On CUDA, the most GPU memory (GB) each scan's tiles and chunks may take, as reconstruct's.")
@_option("--verbose", is_flag=True, show_default=True,
         help="Dask's own logs at INFO, all of them (default: WARNING and up, less the scheduler's error for a "
              "task whose worker died, which batch retries and reports as 'retried').")
@_option("--sample", default="auto", show_default=True, type=click.Choice(["auto", "all"]),
         help="As for reconstruct (a scan's own mask goes in the manifest's 'mask' column).")
@_sample_margin_option
@_tmp_dir_option
@_output_format_option
def batch(manifest, outdir, scheduler, workers, gpus_per_worker, retries, part, method, weights, memory_gb,
          gpu_memory_gb, verbose, sample, sample_margin, tmp_dir, output_format):
    """Reconstruct every scan of MANIFEST on a Dask cluster; resumable (done scans are skipped).

    MANIFEST: a text file of scan paths, one a line, or a CSV with a 'scan' column and optional
    'label' and 'slice_axis' columns (relative paths are relative to the manifest). Prints the
    dashboard's address, then one line per scan as it ends. Writes OUTDIR/batch_report.jsonl (a
    line per scan as it ends, appended run after run) and OUTDIR/batch_summary.csv (one row per
    scan: its latest attempt). A scan another run is writing (another driver) is left to it and
    said as held. Exit codes: 0 all done (or held elsewhere), 3 some scans failed (named in the
    report), 2 bad manifest or options, or no Dask (pip install '.[cluster]').
    """
    from ctpore.app.batch_console import BatchConsole, final_line
    from ctpore.pipelines.batch import read_manifest, require_cluster, run_batch, select_part, summarize
    from ctpore.pipelines.batch_summary import SUMMARY_NAME

    require_cluster()  # before anything: without Dask's scheduler nothing can run
    total = len(select_part(read_manifest(manifest), part))  # run_batch reads it again, checks and all
    with BatchConsole(total) as say:
        res = run_batch(manifest, outdir, scheduler=scheduler, workers=workers, gpus_per_worker=gpus_per_worker,
                        retries=retries, part=part, on_record=say.record, on_start=say.start, on_retry=say.retry,
                        verbose=verbose, options={"method": method, "weights": weights, "memory_gb": memory_gb,
                                                  "gpu_memory_gb": gpu_memory_gb, "sample": sample,
                                                  "sample_margin": sample_margin, "tmp_dir": tmp_dir,
                                                  "output_format": output_format})
    s = summarize(res["records"])
    click.echo(final_line(s, outdir, SUMMARY_NAME))
    return EXIT_PARTIAL if s["failed"] else EXIT_OK


@cli.command()
@click.argument("pred", type=click.Path(path_type=Path))
@click.argument("truth", type=click.Path(path_type=Path))
@_option("--prob", type=click.Path(path_type=Path), default=None, show_default="none: MSE of PRED's 0/1 pores",
         help="Pore probability map in [0, 1] (reconstruct's <stem>_prob.nii.gz): the MSE is computed from it.")
@_option("--slice-axis", type=click.IntRange(0, 2), default=None, show_default="2, the third axis",
         help=_SLICE_AXIS_HELP + " The same for all the files.")
@_option("--json", "as_json", is_flag=True, show_default=True, help="Print JSON instead of a table.")
def evaluate(pred, truth, prob, slice_axis, as_json):
    """Compare a pore volume PRED with a ground truth TRUTH (both 0/1).

    The MSE is of the probability map given with --prob; without it, of PRED's 0/1 pores, which
    is the fraction of voxels that differ (1 - accuracy). The output says which (mse_of).
    """
    from ctpore.data.metrics import MSE_OF_BINARY
    from ctpore.pipelines.evaluate import evaluate_files

    m = evaluate_files(pred, truth, prob_path=prob, slice_axis=slice_axis)
    if m.get("mse_of") == MSE_OF_BINARY:
        _warn(f"mse is of the 0/1 pores of {pred} (no --prob), so it equals 1 - voxel accuracy; "
              "give --prob with the probability map (reconstruct's <stem>_prob.nii.gz) for the probability MSE")
    if as_json:
        click.echo(json.dumps(m, indent=2))
    else:
        width = max(len(k) for k in m)
        for k, v in m.items():
            click.echo(f"{k:<{width}}  {v:.6g}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    return EXIT_OK


@cli.command()
@click.argument("scan", type=click.Path(path_type=Path))
@_option("--slice-axis", type=click.IntRange(0, 2), default=None, show_default="2, the third axis",
         help=_SLICE_AXIS_HELP)
@_option("--json", "as_json", is_flag=True, show_default=True, help="Print JSON instead of a table.")
def info(scan, slice_axis, as_json):
    """Shape, spacing, orientation, dtype and intensity range of SCAN.

    When the file gives no length unit (units unknown), the spacing is its own numbers, not mm.
    """
    from ctpore.data.io import load_scan

    with load_scan(scan, slice_axis=slice_axis) as s:
        d = s.describe()
    d = json.loads(json.dumps(d, default=str))
    if as_json:
        click.echo(json.dumps(d, indent=2))
    else:  # each line says the order its values are in
        named = {k: f"{k} {_INFO_ORDER[k]}" if k in _INFO_ORDER else k for k in d}
        if d.get("units") == "unknown":  # the file's own numbers: not known to be mm
            named["spacing_mm"] = "spacing (z, y, x; units unknown, not mm)"
        width = max(len(n) for n in named.values())
        for k, v in d.items():
            click.echo(f"{named[k]:<{width}}  {v}")
    return EXIT_OK


#: How ``ctpore info`` says which order the values of a line are in.
_INFO_ORDER = {"shape": "(Z, Y, X: slices, rows, columns)", "file_shape": "(as the file stores it)",
               "spacing_mm": "(z, y, x)", "orientation": "(of the file's axes i, j, k)",
               "orientation_zyx": "(of Z, Y, X)"}


@cli.command()
@_option("-o", "--outdir", required=True, type=click.Path(path_type=Path),
         help="Output folder for scan_NNNN.nii.gz, label_NNNN.nii.gz and manifest.json (created if missing).")
@_option("--n", "n", default=4, show_default=True, type=click.IntRange(1), help="Number of scan/label pairs.")
@_option("--size", default=64, show_default=True, type=click.IntRange(8), help="Edge of the cubic volume (voxels).")
@_option("--seed", default=0, show_default=True, type=int,
         help="Seed of the set: the same seed, N and size give the same files.")
@_option("--zoom-max", default=1.0, show_default=True, type=click.FloatRange(1.0),
         help="Enlarge the features of half the scans by a factor up to this (as at a finer voxel size).")
@_option("--scene", default=None, show_default="the material fills the volume",
         type=click.Choice(["random", "core-air", "core-air-offcentre", "tube-gap", "tube-grey", "fov-circle",
                            "brine-tube", "core-wider-than-fov", "block-turned", "core-anisotropic", "tube-touching"]),
         help="What the scanner sees around the material: a core in air, in a tube, in a circular field of view, a "
              "block... (random: any of them); the true sample is written too (sample_NNNN.nii.gz, 1 = sample).")
def simulate(outdir, n, size, seed, zoom_max, scene):
    """Write N simulated CT scans of porous media with their true pores (scan_*.nii.gz, label_*.nii.gz)."""
    from ctpore.data.synthetic import write_pairs

    with _Progress("simulate") as bar:
        entries = write_pairs(outdir, n, shape=(size, size, size), seed=seed, progress=bar, zoom_max=zoom_max,
                              scene=scene)
    for e in entries:
        zoom = f"  features ×{e['zoom']:.2f}" if e["zoom"] != 1.0 else ""
        click.echo(f"{Path(outdir) / e['scan']}  {e['family']}  porosity {e['porosity_truth']:.3f}{zoom}")
    return EXIT_OK


@cli.command()
@_option("--config", "config_path", required=True, type=click.Path(path_type=Path),
         help="Training config (YAML), e.g. configs/train.yaml.")
@_option("--run-dir", type=click.Path(path_type=Path), default=None, show_default="runs/<config name>",
         help="Checkpoints and history; an existing checkpoint is resumed.")
@_option("--images", type=click.Path(path_type=Path), default=None, show_default="simulated scans",
         help="Folder of labelled scans (with --labels).")
@_option("--labels", type=click.Path(path_type=Path), default=None, show_default="simulated scans",
         help="Folder of their labels (1 = pore), matched to --images by sorted name.")
@_option("--export", "export_path", type=click.Path(path_type=Path), default=None,
         show_default="<run-dir>/<model>.safetensors", help="Write the trained weights here.")
@_option("--device", default="cpu", show_default=True, callback=_check_device, help="cpu, cuda, cuda:1, ...")
@_option("--no-resume", is_flag=True, show_default=True, help="Start afresh even if the run folder has a checkpoint.")
def train(config_path, run_dir, images, labels, export_path, device, no_resume):
    """Train PoreFormer (or a U-Net baseline) on simulated CT or on labelled scans."""
    from ctpore.pipelines.train import export_weights, load_train_config
    from ctpore.pipelines.train import train as run_train

    cfg = load_train_config(config_path)
    run_dir = run_dir or Path("runs") / config_path.stem
    with _Progress("train") as bar:
        res = run_train(cfg, run_dir, resume=not no_resume, images_dir=images, labels_dir=labels,
                        device=device, progress=bar)
        path = export_weights(res, export_path or run_dir / f"{cfg.model}.safetensors", device=device, progress=bar)
    last = res.history[-1] if res.history else {}
    click.echo(f"trained {cfg.model} for {res.steps} steps in {res.seconds:.0f} s -> {path}")
    click.echo(json.dumps({k: v for k, v in last.items() if k.startswith("val_") or k.startswith("attn")}))
    return EXIT_OK


def main(argv=None) -> None:
    """Entry point of the ``ctpore`` console script."""
    # Reuse freed memory instead of faulting in fresh pages for every chunk's activations
    # (ctpore.runtime says why). Process-wide, so the command sets it, never the library.
    tune_allocator()
    warnings.showwarning = _show_warning  # ctpore's warnings as one line each, on stderr
    try:
        rv = cli.main(args=argv, prog_name="ctpore", standalone_mode=False)
    except click.UsageError as exc:
        cmd = exc.ctx.command_path if exc.ctx is not None else "ctpore"
        _error(f"{exc.format_message()} (see '{cmd} --help')")
        sys.exit(EXIT_INPUT)
    except click.Abort:
        _error("aborted")
        sys.exit(130)
    except InputError as exc:
        _error(str(exc))
        sys.exit(EXIT_INPUT)
    except KeyboardInterrupt:
        _error("interrupted")
        sys.exit(130)
    except Exception as exc:  # an internal error: one line, the traceback on request
        if os.environ.get("CTPORE_DEBUG"):
            raise
        said = _resource_error(exc)  # out of memory, or a device that is not there: what to do
        if said is not None:
            _error(said)
            sys.exit(EXIT_INPUT)
        _error(f"internal error: {type(exc).__name__}: {exc} (set CTPORE_DEBUG=1 for the traceback)")
        sys.exit(EXIT_INTERNAL)
    sys.exit(rv if isinstance(rv, int) else EXIT_OK)


if __name__ == "__main__":
    main()
