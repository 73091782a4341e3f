"""``ctpore train``: training PoreFormer or a U-Net baseline. Registered on the ``ctpore`` group by
:mod:`ctpore.app.cli`; thin like every command: parse, call a pipeline, print."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ctpore.app.console import EXIT_OK
from ctpore.app.console import Progress as _Progress
from ctpore.app.console import check_device as _check_device
from ctpore.app.console import option as _option

__all__ = ["train"]


@click.command()
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
