"""The command says what it did: which MSE evaluate computed, what is wrong with a weights file,
what to do when memory or the device is missing, every option's help and default, and a
progress bar that never runs 0-100% twice under one name."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from typing import ClassVar

import click
import ctpore
import nibabel as nib
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from ctpore.app import console as cli_console
from ctpore.app.cli import cli
from ctpore.app.console import Progress as _Progress
from ctpore.errors import InputError
from ctpore.models import PoreFormer
from ctpore.models.weights import (
    load_checkpoint,
    load_model,
    load_unet,
    read_metadata,
    save_checkpoint,
    save_weights,
)
from helpers import run_cli, small

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py




def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("CTPORE_DEBUG", raising=False)


# --- 1. evaluate says which MSE it computed -------------------------------------------------

@pytest.fixture()
def pred_truth(tmp_path):
    rng = np.random.default_rng(0)
    truth = (rng.random((6, 7, 8)) > 0.6).astype(np.uint8)
    pred = truth.copy()
    pred[0] = 1 - pred[0]  # one slice wrong: accuracy 5/6
    prob = np.clip(pred * 0.8 + 0.1, 0, 1).astype(np.float32)
    for name, arr in (("truth", truth), ("pred", pred), ("prob", prob)):
        img = nib.Nifti1Image(arr, np.eye(4))
        img.header.set_xyzt_units("mm")  # a known unit: no warning about units beside the one tested
        nib.save(img, str(tmp_path / f"{name}.nii.gz"))
    return tmp_path, pred, truth, prob


def test_evaluate_without_prob_says_the_mse_is_of_the_binary_pores(pred_truth, capsys):
    d, pred, truth, _ = pred_truth
    code, out, err = run_cli(["evaluate", d / "pred.nii.gz", d / "truth.nii.gz", "--json"], capsys)
    assert code == 0, err
    m = json.loads(out)
    assert m["mse_of"] == "binary pores"
    assert m["mse"] == pytest.approx(1 - np.mean(pred == truth))  # MSE of 0/1 volumes = 1 - accuracy
    for key in ("porosity", "euler_number", "mse", "dice", "iou", "porosity_error", "euler_error_rel",
                "spacing_mm_zyx", "shape_zyx"):
        assert key in m, key  # the keys, their axis order in their names
    line = one_line(err)
    assert line.startswith("ctpore: warning: ") and "pred.nii.gz" in line
    assert "1 - voxel accuracy" in line and "--prob" in line
    # the table says it too
    code, out, err = run_cli(["evaluate", d / "pred.nii.gz", d / "truth.nii.gz"], capsys)
    assert code == 0
    assert re.search(r"^mse_of\s+binary pores$", out, re.MULTILINE), out
    assert "ctpore: warning:" in err


def test_evaluate_with_prob_says_the_mse_is_of_the_probability(pred_truth, capsys):
    d, _, truth, prob = pred_truth
    code, out, err = run_cli(["evaluate", d / "pred.nii.gz", d / "truth.nii.gz", "--prob", d / "prob.nii.gz",
                              "--json"], capsys)
    assert code == 0, err
    m = json.loads(out)
    assert m["mse_of"] == "probability"
    assert m["mse"] == pytest.approx(np.mean((prob.astype(np.float64) - truth) ** 2), rel=1e-6)
    assert "warning" not in err
    assert list(m).index("mse_of") == list(m).index("mse") + 1  # read beside the MSE


def test_evaluate_api_says_which_mse():
    from ctpore.pipelines.evaluate import evaluate

    t = np.zeros((2, 3, 4), np.uint8)
    t[0] = 1
    assert evaluate(t, t)["mse_of"] == "binary pores"
    assert evaluate(t, t, prob=t.astype(np.float32))["mse_of"] == "probability"


# --- 2. weights files: say what they are -----------------------------------------------------



@pytest.fixture()
def model() -> PoreFormer:
    torch.manual_seed(0)
    return PoreFormer(small()).eval()


@pytest.mark.parametrize("name", ["random.safetensors", "random.bin"])
def test_random_bytes_are_not_told_to_convert_a_pickle(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(np.random.default_rng(1).bytes(4096))
    for fn in (load_model, read_metadata):
        with pytest.raises(InputError) as info:
            fn(path)
        msg = str(info.value)
        assert msg == (f"{path}: is not a safetensors file (its first bytes are not a safetensors header): "
                       "pass the .safetensors weights ctpore wrote")


def test_damaged_pt_and_empty_files(tmp_path):
    pt = tmp_path / "w.pt"
    pt.write_bytes(b"\x00" * 64)
    with pytest.raises(InputError, match="neither a safetensors header nor") as info:
        load_model(pt)
    assert "Convert it" not in str(info.value)
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="the file is empty"):
        load_model(empty)


def test_pickle_checkpoints_keep_the_conversion_advice(tmp_path, model):
    zipped, plain = tmp_path / "w.pt", tmp_path / "w.safetensors"
    torch.save(model.state_dict(), zipped)
    plain.write_bytes(pickle.dumps({"a": 1}, protocol=4))
    for path in (zipped, plain):
        with pytest.raises(InputError, match="ctpore never unpickles weights .* Convert it with"):
            load_model(path)


def test_wrong_shapes_give_one_short_line(tmp_path, model, capsys):
    from safetensors.torch import save_file

    other = PoreFormer(small(d_model=16, n_heads=2, n_kv_heads=None))
    path = tmp_path / "shapes.safetensors"
    save_file({k: v.contiguous() for k, v in other.state_dict().items()}, str(path),
              metadata={"config": model.config.to_json()})
    with pytest.raises(InputError) as info:
        load_model(path)
    msg = str(info.value)
    n = sum(tuple(v.shape) != tuple(model.state_dict()[k].shape) for k, v in other.state_dict().items())
    assert f"{n} tensors differ" in msg
    assert msg.count("expected (") == 2 and msg.count("found (") == 2  # the first two, not all
    assert "these weights are for a different model or config" in msg
    assert len(msg) < 400 and "\n" not in msg
    # through the command: exit 2, that one line
    scan = tmp_path / "scan.nii.gz"
    nib.save(nib.Nifti1Image(np.random.default_rng(0).integers(0, 1000, (12, 12, 6)).astype(np.uint16),
                             np.eye(4)), str(scan))
    code, _, err = run_cli(["reconstruct", scan, "-o", tmp_path / "out", "--method", "poreformer",
                            "--weights", path], capsys)
    assert code == 2
    line = one_line(err)
    assert "shapes.safetensors" in line and f"{n} tensors differ" in line and len(line) < 450


def test_unet_and_checkpoint_mismatches_are_input_errors(tmp_path, model):
    from ctpore.models.unet import build_unet

    bigger = build_unet({"kind": "unet2d", "channels": [8, 16], "strides": [2]})
    bigger.config = {"kind": "unet2d", "channels": [4, 8], "strides": [2]}  # tensors of another config
    path = save_weights(bigger, tmp_path / "unet2d.safetensors")
    with pytest.raises(InputError, match=r"\d+ tensors differ .*different model or config"):
        load_unet(path)

    opt = torch.optim.AdamW(model.parameters())
    ckpt = tmp_path / "checkpoint.safetensors"
    save_checkpoint(ckpt, model, opt, 3, {"a": 1}, [])
    other = PoreFormer(small(d_model=16, n_heads=2, n_kv_heads=None))
    with pytest.raises(InputError, match="--no-resume"):
        load_checkpoint(ckpt, other, torch.optim.AdamW(other.parameters()))
    assert load_checkpoint(ckpt, model, opt)[0] == 3  # the right model still loads


# --- 3. memory and devices: exit 2 and what to do -------------------------------------------

def _evaluate_raises(monkeypatch, exc):
    import ctpore.pipelines.evaluate as ev

    def boom(*a, **k):
        raise exc

    monkeypatch.setattr(ev, "evaluate_files", boom)


def test_memory_error_is_exit_2_with_advice(pred_truth, monkeypatch, capsys):
    d = pred_truth[0]
    _evaluate_raises(monkeypatch, MemoryError("Unable to allocate 8.00 GiB for an array"))
    code, _, err = run_cli(["evaluate", d / "pred.nii.gz", d / "truth.nii.gz"], capsys)
    assert code == 2
    line = one_line(err)
    assert "did not fit in memory" in line and "--memory-gb" in line and "more memory" in line
    assert "internal error" not in line and "Unable to allocate 8.00 GiB" in line


def test_memory_error_behind_another_error_and_in_reconstruct(tmp_path, monkeypatch, capsys):
    import ctpore.pipelines.reconstruct as rec

    def boom(*a, **k):
        try:
            raise MemoryError()
        except MemoryError as exc:
            raise RuntimeError("worker failed") from exc

    monkeypatch.setattr(rec, "reconstruct_file", boom)
    code, _, err = run_cli(["reconstruct", tmp_path / "s.nii.gz", "-o", tmp_path / "o"], capsys)
    assert code == 2 and "did not fit in memory" in one_line(err)


@pytest.mark.parametrize("exc", [
    AssertionError("Torch not compiled with CUDA enabled"),
    RuntimeError("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU"),
    RuntimeError("CUDA error: invalid device ordinal\nCUDA kernel errors might be asynchronously reported"),
])
def test_device_errors_are_exit_2_with_advice(pred_truth, monkeypatch, capsys, exc):
    d = pred_truth[0]
    _evaluate_raises(monkeypatch, exc)
    code, _, err = run_cli(["evaluate", d / "pred.nii.gz", d / "truth.nii.gz"], capsys)
    assert code == 2
    line = one_line(err)
    assert "device is not available" in line and "--device cpu" in line


def test_gpu_out_of_memory_is_exit_2(pred_truth, monkeypatch, capsys):
    d = pred_truth[0]
    _evaluate_raises(monkeypatch, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    code, _, err = run_cli(["evaluate", d / "pred.nii.gz", d / "truth.nii.gz"], capsys)
    assert code == 2 and "GPU ran out of memory" in one_line(err)


@pytest.mark.parametrize("exc", [RuntimeError("shape mismatch in layer 3"), AssertionError("x"),
                                 ValueError("bad thing"), KeyError("k")])
def test_other_errors_stay_internal(pred_truth, monkeypatch, capsys, exc):
    d = pred_truth[0]
    _evaluate_raises(monkeypatch, exc)
    code, _, err = run_cli(["evaluate", d / "pred.nii.gz", d / "truth.nii.gz"], capsys)
    assert code == 1 and "internal error" in one_line(err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_exit_2_before_any_work(tmp_path, capsys):
    scan = tmp_path / "scan.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((8, 8, 4), np.uint16), np.eye(4)), str(scan))
    code, _, err = run_cli(["reconstruct", scan, "-o", tmp_path / "out", "--method", "poreformer",
                            "--device", "cuda"], capsys)
    assert code == 2 and "--device cpu" in one_line(err)
    config = Path(ctpore.__file__).parent / "configs" / "train.yaml"
    for args in (["train", "--config", config, "--run-dir", tmp_path / "run", "--device", "cuda"],
                 ["bench", "quality", "-o", tmp_path / "q", "--device", "cuda:0"]):
        code, _, err = run_cli(args, capsys)
        assert code == 2 and "--device cpu" in one_line(err), args
    assert not (tmp_path / "run").exists() and not (tmp_path / "q").exists()
    code, _, err = run_cli(["train", "--config", config, "--device", "nonsense"], capsys)
    assert code == 2 and "nonsense" in one_line(err)


# --- 4. every option has help and shows its default -----------------------------------------

def _commands(group: click.Group, path=()):
    yield path, group
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def _squash(text: str) -> str:
    return "".join(text.split())  # --help wraps lines (and breaks at hyphens)


def test_every_option_has_help_and_shows_its_default():
    runner = CliRunner()
    names = set()
    for path, cmd in _commands(cli):
        names.add(" ".join(path))
        res = runner.invoke(cli, [*path, "--help"])
        assert res.exit_code == 0, (path, res.output)
        shown = _squash(res.output)
        ctx = click.Context(cmd, info_name=path[-1] if path else "ctpore")
        for opt in cmd.params:
            if not isinstance(opt, click.Option):
                continue
            where = f"ctpore {' '.join(path)} {opt.opts[0]}"
            assert opt.help and opt.help.strip(), f"{where} has no help"
            assert _squash(opt.help) in shown, where
            if opt.is_eager and not opt.expose_value:  # --version
                continue
            if opt.required:
                continue
            default = opt.get_default(ctx, call=True)
            if default is not None:
                assert opt.show_default, f"{where}: default {default!r} not shown"
            assert opt.show_default, f"{where}: says nothing of what happens without it"
            if isinstance(opt.show_default, str):
                expected = opt.show_default
            elif opt.is_flag and default is False:
                expected = "off"
            else:
                expected = str(default)
            assert _squash(f"default: {expected}") in shown, (where, expected)
    for name in ("", "reconstruct", "batch", "attention", "evaluate", "info", "simulate", "train",
                 "bench", "bench speed", "bench gpu", "bench quality"):
        assert name in names, name


def test_shown_defaults_are_the_configured_ones():
    from ctpore.pipelines.reconstruct import DEFAULTS

    for key, shown in cli_console.SHOWN_DEFAULTS.items():
        assert shown == str(DEFAULTS[key]), key
    assert f"--memory-gb (default {DEFAULTS['memory_gb']} GB)" in " ".join(cli.commands["reconstruct"].help.split())


def test_reconstruct_help_says_overwrite_exit_codes_time_and_memory():
    text = " ".join(CliRunner().invoke(cli, ["reconstruct", "--help"]).output.split())
    assert "Existing outputs are kept unless --overwrite is given" in text
    assert "written whole or not at all" in text
    assert "Exit codes: 0 done; 2 bad input or usage" in text and "1 internal error" in text
    assert "batch: 3" in text
    assert "bounded by --memory-gb" in text and "number of voxels" in text
    assert "docs/performance.md" in text
    assert (Path(ctpore.__file__).parent / "docs" / "performance.md").is_file()
    # no measured figure is typed into the help: its only numbers are exit codes and the default budget
    numbers = set(re.findall(r"\d+(?:\.\d+)?", cli.commands["reconstruct"].help))
    assert numbers <= {"0", "1", "2", "3", "1.5"}, numbers


# --- 5. the progress bar: a stage that starts over is a new, named pass ----------------------

class _FakeBar:
    made: ClassVar[list] = []

    def __init__(self, total=None, desc="", **kw):
        self.total, self.desc, self.n, self.closed = total, desc, 0, False
        _FakeBar.made.append(self)

    def refresh(self):
        pass

    def close(self):
        self.closed = True


@pytest.fixture()
def bars(monkeypatch):
    import tqdm.auto

    _FakeBar.made = []
    monkeypatch.setattr(tqdm.auto, "tqdm", _FakeBar)
    return _FakeBar.made


def _forced(label):
    p = _Progress(label)
    p.enabled = True
    return p


def test_progress_marks_a_stage_that_starts_over(bars):
    # what `ctpore train` reports: the validation scans are simulated for training, then again
    # (a wider pool) for the post-processing chosen at export, around a 0/1 "choosing" stage
    calls = ([(i, 3, "simulating training scans") for i in (1, 2, 3)]
             + [(i, 2, "simulating validation scans") for i in (1, 2)]
             + [(i, 4, "train") for i in (1, 2, 3, 4)]
             + [(0, 1, "choosing post-processing on validation scans")]
             + [(i, 5, "simulating validation scans") for i in range(1, 6)]
             + [(1, 1, "choosing post-processing on validation scans")])
    with _forced("train") as bar:
        for c in calls:
            bar(*c)
    assert [b.desc for b in bars] == [
        "train simulating training scans",
        "train simulating validation scans",
        "train train",
        "train choosing post-processing on validation scans",
        "train simulating validation scans (pass 2)",
        "train choosing post-processing on validation scans",  # came back where it was: no new pass
    ]
    assert all(b.closed for b in bars)
    assert (bars[-2].n, bars[-2].total) == (5, 5)


def test_progress_same_stage_restarting_in_a_row(bars):
    with _forced("scan.nii.gz") as bar:
        for _ in range(3):
            for i in (1, 2, 3):
                bar(i, 3, "intensity range")
        bar(1, 2, "predict")
        bar(2, 2, "predict")
    assert [b.desc for b in bars] == ["scan.nii.gz intensity range", "scan.nii.gz intensity range (pass 2)",
                                      "scan.nii.gz intensity range (pass 3)", "scan.nii.gz predict"]


def test_progress_off_without_a_terminal(bars, monkeypatch):
    monkeypatch.setenv("CTPORE_NO_PROGRESS", "1")
    with _Progress("x") as bar:
        bar(1, 2, "read")
    assert bars == []


def test_a_report_records_the_command_as_typed():
    """``typed_command`` gives the options the user typed (long names, defaults left out), so a
    generated page says exactly which command wrote it."""
    import click

    from ctpore.app.console import typed_command

    seen = []

    @click.command("demo")
    @click.argument("scan")
    @click.option("-o", "--outdir", default="docs")
    @click.option("--n", "n", default=6, type=int)
    @click.option("--zoom", default=1.0, type=float)
    @click.option("--quick", is_flag=True)
    def demo(scan, outdir, n, zoom, quick):
        seen.append(typed_command(click.get_current_context()))

    demo.main(["s.nii", "-o", "out", "--zoom", "1.5", "--quick"], prog_name="demo", standalone_mode=False)
    demo.main(["s.nii", "--n", "6"], prog_name="demo", standalone_mode=False)
    assert seen == ["demo s.nii --outdir out --zoom 1.5 --quick", "demo s.nii --n 6"]
