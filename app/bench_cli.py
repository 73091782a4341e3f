"""``ctpore bench``: speed, quality and the GPU checks, registered on the ``ctpore`` group by
:mod:`ctpore.app.cli`."""

from __future__ import annotations

from pathlib import Path

import click

from ctpore.app.console import GPU_MEMORY_DEFAULT as _GPU_MEMORY_DEFAULT
from ctpore.app.console import Progress as _Progress
from ctpore.app.console import check_device as _check_device
from ctpore.app.console import option as _option
from ctpore.app.console import typed_command
from ctpore.app.console import EXIT_OK, EXIT_PARTIAL
from ctpore.errors import InputError


@click.group()
def bench() -> None:
    """Benchmarks: speed of the engine, quality against other methods."""


def _measured(source: Path, name: str) -> dict:
    """The JSON a measuring ``ctpore bench NAME`` wrote, for ``--rewrite``; refused in one line if missing."""
    import json

    if not source.is_file():
        raise InputError(f"{source}: no such file; --rewrite writes the page again from the JSON a measuring "
                         f"`ctpore bench {name}` wrote: run it without --rewrite first")
    try:
        return json.loads(source.read_text())
    except ValueError as exc:
        raise InputError(f"{source}: not JSON ({exc}); run `ctpore bench {name}` without --rewrite") from None


@bench.command("speed")
@_option("--shape", default="96x256x256", show_default=True, help="Scan shape Z x Y x X.")
@_option("--repeats", default=3, show_default=True, type=click.IntRange(1), help="Timed runs per method.")
@_option("--workdir", default=Path("runs/speed"), show_default=True, type=click.Path(path_type=Path),
         help="Where the generated scan and the outputs go.")
@_option("-o", "--outdir", default=Path("docs"), show_default=True, type=click.Path(path_type=Path),
         help="Where performance.md and performance.json are written.")
@_option("--rewrite", is_flag=True, show_default=True,
         help="Measure nothing: write performance.md again from OUTDIR/performance.json and OUTDIR/gpu.json "
         "(after copying in a new `ctpore bench gpu` result).")
def bench_speed(shape, repeats, workdir, outdir, rewrite):
    """ctpore reconstruct beside MONAI's 3D U-Net, the trained 3D U-Net and filtered Otsu: whole-process
    voxels/s and peak memory on one generated scan; writes OUTDIR/performance.md and .json."""
    from ctpore.pipelines.bench.speed import bench_speed as run
    from ctpore.pipelines.bench.speed import write_performance

    if rewrite:
        res = _measured(Path(outdir) / "performance.json", "speed")
        click.echo(f"wrote {write_performance(res, outdir, command=res.get('command', 'ctpore bench speed'))}")
        return EXIT_OK
    try:
        dims = tuple(int(v) for v in shape.lower().split("x"))
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) < 8:
        raise InputError(f"--shape must be Z x Y x X with every size >= 8, like 96x256x256; got {shape!r}")
    with _Progress("speed") as bar:
        res = run(shape=dims, repeats=repeats, workdir=workdir, progress=bar)
    path = write_performance(res, outdir, command=typed_command(click.get_current_context()))
    for m, r in res["methods"].items():
        click.echo(f"{m:<45} {r['voxels_per_s']:10.3g} voxels/s  {r['peak_rss_gb']:5.2f} GB")
    click.echo(f"wrote {path}")
    return EXIT_OK


@bench.command("gpu")
@_option("--workdir", default=Path("runs/gpu"), show_default=True, type=click.Path(path_type=Path),
         help="Where the generated scan and outputs go (the scan is removed after use).")
@_option("--device", default="cuda", show_default=True, help="The CUDA device to check (cuda, cuda:1, ...).")
@_option("--model-shape", default="256x1024x1024", show_default=True,
         help="Z x Y x X of the model-alone timing (a random volume in memory).")
@_option("--reconstruct-shape", default="128x512x512", show_default=True,
         help="Z x Y x X of the generated scan the whole-process reconstruct is timed on.")
@_option("--memory-gb", default=16.0, show_default=True, type=click.FloatRange(0.25),
         help="Host memory budget of the timed reconstruct (GB).")
@_option("--gpu-memory-gb", default=None, type=click.FloatRange(0.25), show_default=_GPU_MEMORY_DEFAULT,
         help="GPU memory cap of the timed runs (GB).")
@_option("--time-limit", default=300, show_default=True, type=click.IntRange(30),
         help="Seconds for the whole run; each step also has its own timeout.")
@_option("-o", "--out", default=Path("docs/gpu.json"), show_default=True, type=click.Path(path_type=Path),
         help="The figures (JSON), rewritten after every step.")
def bench_gpu(workdir, device, model_shape, reconstruct_shape, memory_gb, gpu_memory_gb, time_limit, out):
    """GPU checks in one short run: flash vs sdpa vs math (kernel and model), the SDPA kernel that ran,
    voxels/s and GPU peak memory. Each step runs in its own process with a timeout; one that fails is
    recorded and the next runs. Exit code 3 when some step failed."""
    from ctpore.app.console import parse_shape
    from ctpore.pipelines.bench.gpu import bench_gpu as run

    shapes = parse_shape(model_shape, "--model-shape"), parse_shape(reconstruct_shape, "--reconstruct-shape")
    cmd = (f"ctpore bench gpu --device {device} --model-shape {model_shape} --reconstruct-shape {reconstruct_shape} "
           f"--memory-gb {memory_gb:g} --time-limit {time_limit}"
           + (f" --gpu-memory-gb {gpu_memory_gb:g}" if gpu_memory_gb is not None else ""))
    with _Progress("gpu") as bar:
        res = run(workdir, out, device=device, model_shape=shapes[0], reconstruct_shape=shapes[1], memory_gb=memory_gb,
                  gpu_memory_gb=gpu_memory_gb, time_limit=time_limit, progress=bar, command=cmd)
    for name, step in res["steps"].items():
        why = next((e["error"] for e in res["errors"] if e["step"] == name), "")
        click.echo(f"{name:<12} {'ok' if step['ok'] else 'FAILED':<6} {step['seconds']:7.1f} s  {why}".rstrip())
    click.echo(f"wrote {out}")
    return EXIT_PARTIAL if res["errors"] else EXIT_OK


@bench.command("quality")
@_option("--n-sim", default=8, show_default=True, type=click.IntRange(0), help="Held-out simulated scans.")
@_option("--size", default=64, show_default=True, type=click.IntRange(16), help="Edge of the simulated scans.")
@_option("--leopard", type=click.Path(path_type=Path), default=None,
         show_default="tests/data/leopard_porespy/label.nii.gz in the repository, else leopard_porespy/label.nii.gz "
                      "in $CTPORE_SHARED_DATA or ../shared/data beside the repository",
         help="Real pore label to scan with the simulator.")
@_option("--real-scan", type=click.Path(path_type=Path), default=None,
         show_default="quantimpy_rock/gray.nii.gz in the same folder", help="Real unlabelled scan.")
@_option("-o", "--outdir", default=Path("docs"), show_default=True, type=click.Path(path_type=Path),
         help="Where benchmark.md and benchmark.json are written.")
@_option("--device", default="cpu", show_default=True, callback=_check_device, help="cpu, cuda, cuda:1, ...")
@_option("--weights-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
         show_default="the shipped weights", help="Folder with poreformer/unet2d/unet3d.safetensors.")
@_option("--seed-base", default=None, type=click.IntRange(0), show_default="the held-out benchmark range",
         help="Simulate the cases from this seed instead (e.g. 2000100 for further unseen scans to "
              "compare candidates on).")
@_option("--zoom-max", default=1.0, show_default=True, type=click.FloatRange(1.0),
         help="Enlarge the features of half the simulated scans by up to this factor.")
@_option("--simulated-only", is_flag=True, show_default=True, help="Leave out the Leopard case and the real scan.")
@_option("--methods", default=None, show_default="the benchmark's columns of the method table",
         help="The methods to score, comma-separated (e.g. poreformer alone, to compare candidate weights).")
def bench_quality(n_sim, size, leopard, real_scan, outdir, device, weights_dir, seed_base, zoom_max, simulated_only,
                  methods):
    """PoreFormer beside Otsu, the Fiji pipeline and U-Nets: writes OUTDIR/benchmark.md and .json."""
    from ctpore.pipelines.bench import bench_quality as run
    from ctpore.pipelines.bench import default_leopard, default_shared, write_report
    from ctpore.pipelines.methods import bench_names, get_method

    shared = default_shared()
    if leopard is None:
        leopard = default_leopard()
    if real_scan is None and shared is not None and (shared / "quantimpy_rock" / "gray.nii.gz").exists():
        real_scan = shared / "quantimpy_rock" / "gray.nii.gz"
    if simulated_only:
        leopard = real_scan = None
    from ctpore.data.splits import BENCH_SEED_BASE

    with _Progress("bench") as bar:
        chosen = bench_names() if methods is None else tuple(get_method(m.strip()).name for m in methods.split(",")
                                                          if m.strip())
        res = run(n_sim=n_sim, size=size, leopard=leopard, real_scan=real_scan, device=device, progress=bar,
                  weights=weights_dir, seed_base=BENCH_SEED_BASE if seed_base is None else seed_base,
                  zoom_max=zoom_max, methods=chosen)
    write_report(res, outdir, command=typed_command(click.get_current_context()))
    width = max(len(m) for m in res["summary"])
    click.echo(f"{'method':<{width}}  {'MSE':>8}  {'Dice':>6}  {'Euler err':>9}  {'φ err':>7}  {'s':>6}")
    for m, v in res["summary"].items():
        click.echo(f"{m:<{width}}  {v['mse']:8.4f}  {v['dice']:6.3f}  {v['euler_error_rel']:9.3f}  "
                   f"{v['porosity_error']:7.4f}  {v['seconds']:6.2f}")
    click.echo(f"wrote {outdir / 'benchmark.md'}")
    return EXIT_OK


@bench.command("sample")
@_option("--n", "n", default=6, show_default=True, type=click.IntRange(1), help="Simulated scans per set-up.")
@_option("--shape", default="24x160x160", show_default=True, help="Scan shape Z x Y x X.")
@_option("--timings", default=None, type=click.Path(path_type=Path), show_default="none",
         help="A folder of scripts/sample_step_time.py results (before_KIND.json, now_KIND.json) to tabulate.")
@_option("-o", "--outdir", default=Path("docs"), show_default=True, type=click.Path(path_type=Path),
         help="Where sample.md and sample.json are written.")
def bench_sample(n, shape, timings, outdir):
    """How well the sample is found: every set-up scanners make (a core in air, in a tube, in a circular
    field of view, a block, ...), each scan reconstructed with the sample found and with its true sample;
    writes OUTDIR/sample.md and .json."""
    import json

    from ctpore.app.console import parse_shape
    from ctpore.pipelines.bench.sample import bench_sample as run
    from ctpore.pipelines.bench.sample import write_sample_report

    dims = parse_shape(shape, "--shape")
    pairs = {}
    if timings is not None:
        for before in sorted(Path(timings).glob("before_*.json")):
            kind = before.stem[len("before_"):]
            now = before.with_name(f"now_{kind}.json")
            if now.exists():
                pairs[kind] = (json.loads(before.read_text()), json.loads(now.read_text()))
    with _Progress("sample") as bar:
        res = run(n=n, shape=dims, progress=bar)
    path = write_sample_report(res, outdir, typed_command(click.get_current_context()), pairs)
    for setup, v in res["summary"].items():
        click.echo(f"{setup:<22} meets all {v['meet_all']}/{v['cases']}  IoU min {v['iou_min']:.4f}  "
                   f"porosity diff max {v['porosity_diff_max']:.4f}")
    click.echo(f"wrote {path}")
    return EXIT_OK


@bench.command("adapt")
@_option("--quick", is_flag=True, show_default=True, help="One small scan and a few steps (a check that it runs).")
@_option("--shape", default="128x256x256", show_default=True, help="Scan shape Z x Y x X.")
@_option("--n-scans", default=4, show_default=True, type=click.IntRange(1), help="Scans (one per pore family).")
# the pipeline's STEPS (a test keeps them equal; the command does not import the pipeline to start)
@_option("--steps", default=600, show_default=True, type=click.IntRange(1), help="Most steps of each tuning.")
@_option("--minutes", default=10.0, show_default=True, type=click.FloatRange(0.1), help="Most minutes of each.")
@_option("--workdir", default=Path("runs/adapt"), show_default=True, type=click.Path(path_type=Path),
         help="Where the scans, labels and tuned weights go.")
@_option("-o", "--outdir", default=Path("docs"), show_default=True, type=click.Path(path_type=Path),
         help="Where adapt.md and adapt.json are written.")
@_option("--no-real", "no_real", is_flag=True, show_default=True,
         help="Leave out the real Leopard sandstone's geometry (the tests' copy), run otherwise and reported "
              "on its own (never with --quick).")
def bench_adapt(quick, shape, n_scans, steps, minutes, workdir, outdir, no_real):
    """Adapting to a scanner and labeller ctpore never met, from 1 or 3 labelled slices, beside the Fiji
    pipeline and the untuned models; writes OUTDIR/adapt.md and .json."""
    from ctpore.app.console import parse_shape
    from ctpore.pipelines.bench.adapt import bench_adapt as run
    from ctpore.pipelines.bench.adapt import write_adapt_report
    from ctpore.pipelines.bench.quality import default_leopard

    dims = (24, 64, 64) if quick else parse_shape(shape, "--shape")
    n_scans, steps = (1, 5) if quick else (n_scans, steps)
    real = not no_real and not quick
    label = default_leopard() if real else None
    if real and label is None:
        click.echo("note: the Leopard sandstone's label is not here; the real geometry is left out", err=True)
    with _Progress("bench adapt") as bar:
        res = run(shape=dims, n_scans=n_scans, steps=steps, minutes=minutes, workdir=workdir, real=label,
                  progress=bar)
    jpath, mpath = write_adapt_report(res, outdir, typed_command(click.get_current_context()))
    for name, m in res["means"].items():
        click.echo(f"{name:<28} MSE {m['mse']:.4f}  Dice {m['dice']:.3f}  |χ err| {m['euler_error']:.1f}  "
                   f"{m['adapt_seconds']:.0f} s")
    click.echo(f"wrote {mpath} and {jpath}")
    return EXIT_OK


@bench.command("analysis")
@_option("--quick", is_flag=True, show_default=True, help="Small volumes only (a check that it runs).")
@_option("--sizes", default="256,512,1024", show_default=True, help="Edge lengths of the whole-process runs.")
@_option("--porespy-max", default=512, show_default=True, type=click.IntRange(1),
         help="The largest edge length PoreSpy runs on (it holds the volume and its maps whole).")
@_option("--sim-size", default=128, show_default=True, type=click.IntRange(16),
         help="Edge length of each pore family's simulated volume.")
@_option("--porespy-python", default=None, show_default="this Python, where PoreSpy is installed",
         help="A Python with porespy 3.2 installed (PoreSpy runs in a child process).")
@_option("--limit-minutes", default=30.0, show_default=True, type=click.FloatRange(0.1),
         help="PoreSpy's run on a volume that takes longer is said not to finish.")
@_option("--workdir", default=Path("runs/analysis"), show_default=True, type=click.Path(path_type=Path),
         help="Where the volumes and the children's outputs go.")
@_option("-o", "--outdir", default=Path("docs"), show_default=True, type=click.Path(path_type=Path),
         help="Where analysis.md and analysis.json are written.")
def bench_analysis(quick, sizes, porespy_max, sim_size, porespy_python, limit_minutes, workdir, outdir):
    """ctpore analyze beside PoreSpy (local thickness), scikit-image (labelling, marching cubes) and the
    analytic truth; whole processes timed on simulated volumes. Writes OUTDIR/analysis.md and .json."""
    from ctpore.pipelines.bench.analysis import bench_analysis as run
    from ctpore.pipelines.bench.analysis_report import write_analysis_report

    try:
        edges = (48,) if quick else tuple(int(s) for s in sizes.split(",") if s.strip())
    except ValueError:
        raise click.BadParameter(f"give edge lengths separated by commas, got {sizes!r}",
                                 param_hint="--sizes") from None
    with _Progress("bench analysis") as bar:
        res = run(sizes=edges, sim_size=32 if quick else sim_size, porespy_python=porespy_python, workdir=workdir,
                  limit_s=60.0 * limit_minutes, porespy_max=porespy_max, progress=bar)
    command = typed_command(click.get_current_context())
    if porespy_python:  # a path of this machine: the report names what it is instead
        command = command.replace(str(porespy_python), "PY")
        res["porespy_python"] = "PY: a Python with porespy installed"
    jpath, mpath = write_analysis_report(res, outdir, command)
    if not res["porespy"]:
        click.echo("PoreSpy was not found (pip install porespy==3.2.0, or give --porespy-python): "
                   "its columns are empty")
    click.echo(f"wrote {mpath} and {jpath}")
    return EXIT_OK


@bench.command("flow")
@_option("--cube", default=200, show_default=True, type=click.IntRange(16, 400),
         help="The largest cube taken from the Leopard sandstone (its whole 100³ where smaller).")
@_option("--sim-size", default=128, show_default=True, type=click.IntRange(16, 400),
         help="Edge length of each pore family's simulated volume.")
@_option("--workdir", default=Path("runs/flow"), show_default=True, type=click.Path(path_type=Path),
         help="Where the volumes go.")
@_option("-o", "--outdir", default=Path("docs"), show_default=True, type=click.Path(path_type=Path),
         help="Where flow.md and flow.json are written.")
def bench_flow(cube, sim_size, workdir, outdir):
    """ctpore analyze --flow (permeability, tortuosity) on an analytic channel, the Leopard sandstone and
    each pore family, each timed in a process of its own. Writes OUTDIR/flow.md and .json."""
    from ctpore.pipelines.bench.flow import bench_flow as run
    from ctpore.pipelines.bench.flow import write_flow_report
    from ctpore.pipelines.flow import check_flow

    check_flow(cube, (1.0, 1.0, 1.0), True)  # the extra installed, or one line
    with _Progress("bench flow") as bar:
        res = run(cube=cube, sim_size=sim_size, workdir=workdir, progress=bar)
    jpath, mpath = write_flow_report(res, outdir, typed_command(click.get_current_context()))
    click.echo(f"wrote {mpath} and {jpath}")
    return EXIT_OK


@bench.command("split")
@_option("--shape", default="896x256x256", show_default=True, help="Scan shape Z x Y x X (a simulated core in air).")
@_option("--slab-slices", default=None, type=click.IntRange(1), show_default="8 x the model's reach along Z",
         help="Slices per slab.")
@_option("--workdir", default=Path("runs/split"), show_default=True, type=click.Path(path_type=Path),
         help="Where the scan and the outputs go.")
@_option("-o", "--outdir", default=Path("docs"), show_default=True, type=click.Path(path_type=Path),
         help="Where scale.md and scale.json are written.")
@_option("--rewrite", is_flag=True, show_default=True,
         help="Measure nothing: write scale.md again from OUTDIR/scale.json and OUTDIR/gpu.json "
         "(after copying in a new `ctpore bench gpu` result).")
def bench_split(shape, slab_slices, workdir, outdir, rewrite):
    """One scan reconstructed in one process and split across local clusters of 1 and 2 workers, each
    in a process of its own: wall and CPU seconds, the split's extra work (warm-up halos and joins),
    per-slab times, and a model of 2048^3 and 4096^3 scans on N nodes. Writes OUTDIR/scale.md and .json."""
    from ctpore.pipelines.batch_cluster import require_cluster
    from ctpore.pipelines.bench.split import bench_split as run
    from ctpore.pipelines.bench.split import write_scale_report

    if rewrite:
        res = _measured(Path(outdir) / "scale.json", "split")
        click.echo(f"wrote {write_scale_report(res, outdir, res.get('command', 'ctpore bench split'))[1]}")
        return EXIT_OK
    require_cluster()
    try:
        dims = tuple(int(v) for v in shape.lower().split("x"))
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) < 8:
        raise InputError(f"--shape must be Z x Y x X with every size >= 8, like 896x256x256; got {shape!r}")
    with _Progress("bench split") as bar:
        res = run(shape=dims, slab_slices=slab_slices, workdir=workdir, progress=bar)
    jpath, mpath = write_scale_report(res, outdir, typed_command(click.get_current_context()))
    for n, r in res["split"].items():
        click.echo(f"{n} worker(s): {r['wall_s']} s (one process {res['single']['wall_s']} s), extra work "
                   f"{100 * r['extra_share']:.1f}%, same voxels and metrics: {r['same_voxels'] and r['same_metrics']}")
    click.echo(f"wrote {mpath} and {jpath}")
    return EXIT_OK
