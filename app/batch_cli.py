"""``ctpore batch``: many scans on a Dask cluster, resumable. Registered on the ``ctpore`` group by
:mod:`ctpore.app.cli`; thin like every command: parse, call a pipeline, print."""

from __future__ import annotations

from pathlib import Path

import click

from ctpore.app.console import EXIT_OK, EXIT_PARTIAL
from ctpore.app.console import GPU_MEMORY_DEFAULT as _GPU_MEMORY_DEFAULT
from ctpore.app.console import SHOWN_DEFAULTS as _SHOWN_DEFAULTS
from ctpore.app.console import method_choice as _method_choice
from ctpore.app.console import option as _option
from ctpore.app.console import output_format_option as _output_format_option
from ctpore.app.console import reconstruct_default as _rdefault
from ctpore.app.console import sample_margin_option as _sample_margin_option
from ctpore.app.console import tmp_dir_option as _tmp_dir_option

__all__ = ["batch"]


@click.command()
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
@_option("--analyze", is_flag=True, show_default=True,
         help="Also analyse each scan's pores as ctpore analyze does (pore sizes, surface, connected and "
              "percolating porosity); the figures reach the metrics and the summary's columns.")
@_option("--flow", is_flag=True, show_default=True,
         help="Also the permeability and tortuosity of each scan, as reconstruct --flow; implies --analyze.")
def batch(manifest, outdir, scheduler, workers, gpus_per_worker, retries, part, method, weights, memory_gb,
          gpu_memory_gb, verbose, sample, sample_margin, tmp_dir, output_format, analyze, flow):
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
    from ctpore.pipelines.batch_manifest import read_manifest, select_part
    from ctpore.pipelines.batch_cluster import require_cluster
    from ctpore.pipelines.batch import run_batch, summarize
    from ctpore.pipelines.batch_summary import SUMMARY_NAME

    require_cluster()  # before anything: without Dask's scheduler nothing can run
    total = len(select_part(read_manifest(manifest), part))  # run_batch reads it again, checks and all
    with BatchConsole(total) as say:
        res = run_batch(manifest, outdir, scheduler=scheduler, workers=workers, gpus_per_worker=gpus_per_worker,
                        retries=retries, part=part, on_record=say.record, on_start=say.start, on_retry=say.retry,
                        verbose=verbose, options={"method": method, "weights": weights, "memory_gb": memory_gb,
                                                  "gpu_memory_gb": gpu_memory_gb, "sample": sample,
                                                  "sample_margin": sample_margin, "tmp_dir": tmp_dir,
                                                  "output_format": output_format, "analyze": analyze or flow,
                                                  **({"flow": True} if flow else {})})
    s = summarize(res["records"])
    click.echo(final_line(s, outdir, SUMMARY_NAME))
    return EXIT_PARTIAL if s["failed"] else EXIT_OK
