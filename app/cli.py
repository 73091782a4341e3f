"""The ``ctpore`` command. Thin: parse, call a pipeline, print.

Exit codes (DESIGN.md): 0 done; 2 bad input or usage (one line on stderr naming the file and what
is wrong); 1 internal error; ``batch``: 3 when some scans failed and the rest were done.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from ctpore import __version__
from ctpore.data.errors import InputError

EXIT_OK, EXIT_INTERNAL, EXIT_INPUT, EXIT_PARTIAL = 0, 1, 2, 3


class _Progress:
    """A tqdm bar fed by a pipeline's ``progress(done, total, stage)`` callback.

    Shown only when stderr is a terminal, so logs and error output stay one clean line.
    """

    def __init__(self, label: str = ""):
        self.label = label
        self.bar = None
        self.stage = None
        self.enabled = sys.stderr.isatty() and not os.environ.get("CTPORE_NO_PROGRESS")

    def __call__(self, done: int, total: int, stage: str) -> None:
        if not self.enabled:
            return
        from tqdm.auto import tqdm

        if stage != self.stage or self.bar is None:
            self.close()
            self.stage = stage
            desc = f"{self.label} {stage}".strip()
            self.bar = tqdm(total=total, desc=desc, unit="step", leave=False, file=sys.stderr)
        self.bar.total = total
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _error(message: str) -> None:
    click.echo(f"ctpore: error: {message}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ctpore")
def cli() -> None:
    """ctpore: the 3D pore space of soil and rock from X-ray micro-CT scans."""


def _rdefault(key):
    from ctpore.pipelines.reconstruct import DEFAULTS

    return DEFAULTS[key]


@cli.command()
@click.argument("scans", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--outdir", required=True, type=click.Path(path_type=Path), help="Output folder.")
@click.option("--method", default=lambda: _rdefault("method"), show_default="auto",
              type=click.Choice(["auto", "poreformer", "otsu", "plain-otsu"]),
              help="auto = PoreFormer when weights are installed, else otsu (median + Otsu + speck removal).")
@click.option("--weights", type=click.Path(path_type=Path), default=None,
              help="PoreFormer weights (.safetensors); default: the shipped weights.")
@click.option("--slice-axis", type=click.IntRange(0, 2), default=None,
              help="The file's voxel axis that holds the slices (NIfTI; default 2, the third).")
@click.option("--truth", type=click.Path(path_type=Path), default=None,
              help="Ground-truth pores (1 = pore) to add MSE, Dice and Euler error to the metrics.")
@click.option("--overwrite", is_flag=True, help="Replace existing outputs.")
@click.option("--device", default=lambda: _rdefault("device"), show_default="cpu", help="cpu, cuda, cuda:1, ...")
@click.option("--chunk-slices", default=lambda: _rdefault("chunk_slices"), show_default="32", type=click.IntRange(1), help="Slices per streamed chunk.")
@click.option("--tile", default=lambda: _rdefault("tile"), show_default="256", type=click.IntRange(8), help="In-plane tile size (pixels).")
def reconstruct(scans, outdir, method, weights, slice_axis, truth, overwrite, device, chunk_slices, tile):
    """Reconstruct the 3D pores of SCANS (NIfTI .nii/.nii.gz, TIFF stack or folder of TIFF slices).

    Writes OUTDIR/<stem>_pores.nii.gz, <stem>_prob.nii.gz and <stem>_metrics.json per scan.
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
@click.argument("pred", type=click.Path(path_type=Path))
@click.argument("truth", type=click.Path(path_type=Path))
@click.option("--prob", type=click.Path(path_type=Path), default=None, help="Probability map, for the MSE.")
@click.option("--slice-axis", type=click.IntRange(0, 2), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def evaluate(pred, truth, prob, slice_axis, as_json):
    """Compare a pore volume PRED with a ground truth TRUTH (both 0/1)."""
    from ctpore.pipelines.evaluate import evaluate_files

    m = evaluate_files(pred, truth, prob_path=prob, slice_axis=slice_axis)
    if as_json:
        click.echo(json.dumps(m, indent=2))
    else:
        width = max(len(k) for k in m)
        for k, v in m.items():
            click.echo(f"{k:<{width}}  {v:.6g}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    return EXIT_OK


@cli.command()
@click.argument("scan", type=click.Path(path_type=Path))
@click.option("--slice-axis", type=click.IntRange(0, 2), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def info(scan, slice_axis, as_json):
    """Shape, spacing, orientation, dtype and intensity range of SCAN."""
    from ctpore.data.io import load_scan

    with load_scan(scan, slice_axis=slice_axis) as s:
        d = s.describe()
    d = json.loads(json.dumps(d, default=str))
    if as_json:
        click.echo(json.dumps(d, indent=2))
    else:
        width = max(len(k) for k in d)
        for k, v in d.items():
            click.echo(f"{k:<{width}}  {v}")
    return EXIT_OK


@cli.command()
@click.option("-o", "--outdir", required=True, type=click.Path(path_type=Path))
@click.option("--n", "n", default=4, show_default=True, type=click.IntRange(1))
@click.option("--size", default=64, show_default=True, type=click.IntRange(8), help="Edge of the cubic volume.")
@click.option("--seed", default=0, show_default=True, type=int)
def simulate(outdir, n, size, seed):
    """Write N simulated CT scans of porous media with their true pores (scan_*.nii.gz, label_*.nii.gz)."""
    from ctpore.data.synthetic import write_pairs

    with _Progress("simulate") as bar:
        entries = write_pairs(outdir, n, shape=(size, size, size), seed=seed, progress=bar)
    for e in entries:
        click.echo(f"{Path(outdir) / e['scan']}  {e['family']}  porosity {e['porosity_truth']:.3f}")
    return EXIT_OK


@cli.group()
def bench() -> None:
    """Benchmarks: speed of the engine, quality against other methods."""


@bench.command("speed")
@click.option("--size", default=128, show_default=True, type=click.IntRange(8))
@click.option("--backend", "backends", multiple=True, default=("math", "sdpa"), show_default=True)
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1))
@click.option("--window", default=None, type=click.IntRange(1))
def bench_speed(size, backends, repeats, window):
    """Voxels per second of PoreFormer (random weights) per attention backend on a SIZE^3 volume."""
    from ctpore.pipelines.speed import bench_speed as run

    with _Progress("speed") as bar:
        res = run(size=size, backends=tuple(backends), repeats=repeats, window=window, progress=bar)
    click.echo(json.dumps(res, indent=2))
    return EXIT_OK


def main(argv=None) -> None:
    """Entry point of the ``ctpore`` console script."""
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
        _error(f"internal error: {type(exc).__name__}: {exc} (set CTPORE_DEBUG=1 for the traceback)")
        sys.exit(EXIT_INTERNAL)
    sys.exit(rv if isinstance(rv, int) else EXIT_OK)


if __name__ == "__main__":
    main()
