"""The console side of the ``ctpore`` command: progress bars, one-line errors and warnings, the
options' help, and which failures are the user's to fix (exit 2) rather than ctpore's (exit 1).

:mod:`ctpore.app.cli` holds the commands; this module holds what they share.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import click

from ctpore.errors import CtporeWarning, InputError

#: How --gpu-memory-gb's default reads in --help.
GPU_MEMORY_DEFAULT = "the GPU's free memory less a margin"

__all__ = ["GPU_MEMORY_DEFAULT", "Progress", "error", "warn", "resource_error", "check_device", "show_warning",
           "Option", "option", "SLICE_AXIS_HELP", "DEVICE_UNAVAILABLE", "MEMORY_ADVICE", "EXIT_OK", "EXIT_INTERNAL",
           "EXIT_INPUT", "EXIT_PARTIAL", "SHOWN_DEFAULTS", "MethodChoice", "method_choice", "method_help",
           "reconstruct_default", "typed_command"]

#: Exit codes of every command: done; an internal error; bad input or usage; batch: some scans failed.
EXIT_OK, EXIT_INTERNAL, EXIT_INPUT, EXIT_PARTIAL = 0, 1, 2, 3


class Progress:
    """A tqdm bar fed by a pipeline's ``progress(done, total, stage)`` callback.

    Shown only when stderr is a terminal, so logs and error output stay one clean line. A stage
    that starts over (its ``done`` falls back, or its ``total`` changes: the same work done again,
    e.g. ``ctpore train`` simulates validation scans for training and again for the export) gets
    a new bar marked ``(pass 2)``, ``(pass 3)``..., never a second 0-100% under the same name. A
    stage that comes back where it left off (after a nested stage) goes on under its own name.
    """

    def __init__(self, label: str = ""):
        self.label = label
        self.bar = None
        self.stage = None
        self.seen: dict[str, tuple[int, int, int]] = {}  # stage -> (done, total, pass) last reported
        self.enabled = sys.stderr.isatty() and not os.environ.get("CTPORE_NO_PROGRESS")

    def __call__(self, done: int, total: int, stage: str) -> None:
        if not self.enabled:
            return
        from tqdm.auto import tqdm

        last = self.seen.get(stage)
        n_pass = 1 if last is None else last[2]
        restart = last is not None and (done < last[0] or total != last[1])
        n_pass += restart
        self.seen[stage] = (done, total, n_pass)
        if restart or stage != self.stage or self.bar is None:
            self.close()
            self.stage = stage
            desc = f"{self.label} {stage}".strip() + (f" (pass {n_pass})" if n_pass > 1 else "")
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


def error(message: str) -> None:
    click.echo(f"ctpore: error: {message}", err=True)


def warn(message: str) -> None:
    click.echo(f"ctpore: warning: {message}", err=True)


#: What torch says when asked for a device this machine (or this torch build) does not have.
DEVICE_UNAVAILABLE = (
    "Torch not compiled with",  # an AssertionError of a CPU-only build asked for cuda (or xpu)
    "Found no NVIDIA driver",
    "no CUDA GPUs are available",
    "no CUDA-capable device is detected",
    "CUDA driver version is insufficient",
    "CUDA driver initialization failed",
    "invalid device ordinal",
    "busy or unavailable",
    "device type at start of device string",  # torch.device("nonsense")
)

MEMORY_ADVICE = ("try a smaller --memory-gb (reconstruct, batch), or a machine with more memory "
                  "(set CTPORE_DEBUG=1 for the traceback)")


def first_line(exc: BaseException, limit: int = 160) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def resource_error(exc: BaseException) -> str | None:
    """The one line for running out of memory or asking for a device that is not there; None for
    anything else (which stays an internal error). Looks at ``exc`` and the exceptions it was
    raised from, and only at these kinds: MemoryError, torch's OutOfMemoryError, and the
    RuntimeError/AssertionError messages torch gives for a missing device or a failed allocation."""
    torch = sys.modules.get("torch")  # loaded by whatever ran; never imported here
    oom_types: tuple = ()
    if torch is not None:
        oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                      getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)) if t)
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        detail = first_line(e)
        if isinstance(e, MemoryError):
            return f"out of memory: the scan did not fit in memory{f' ({detail})' if detail else ''}; {MEMORY_ADVICE}"
        if oom_types and isinstance(e, oom_types):
            return (f"the GPU ran out of memory ({detail}); try a smaller --gpu-memory-gb or --tile, or --device cpu "
                    "(set CTPORE_DEBUG=1 for the traceback)")
        if isinstance(e, (RuntimeError, AssertionError)):
            text = str(e)
            if "can't allocate memory" in text:  # torch's CPU allocator
                return f"out of memory: the scan did not fit in memory ({detail}); {MEMORY_ADVICE}"
            if any(m in text for m in DEVICE_UNAVAILABLE):
                return (f"the requested device is not available ({detail}); use --device cpu, or run on a "
                        "machine whose GPU and torch build match --device")
        e = e.__cause__
    return None


def check_device(ctx, param, value):
    """``--device``: refused before any work starts when this machine cannot use it."""
    if value is None or value == "cpu" or ctx.resilient_parsing:  # the CPU is always there (no torch import)
        return value
    from ctpore.pipelines.precision import resolve_device

    resolve_device(value)  # an InputError (exit 2, one line) for a device that is not there
    return value


_python_showwarning = warnings.showwarning


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """ctpore's own warnings as ``ctpore: warning: ...`` (one line); others as Python prints them."""
    if issubclass(category, CtporeWarning):
        click.echo(f"ctpore: warning: {' '.join(str(message).split())}", err=True)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


class Option(click.Option):
    """An option whose ``[default: ...]`` reads well: a descriptive default (a string given as
    ``show_default``) is shown as written, without the parentheses click puts around it, and a
    flag that is off by default says so."""

    def get_help_extra(self, ctx):  # click >= 8.2; older click shows "(text)", still correct
        extra = super().get_help_extra(ctx)
        if isinstance(self.show_default, str) and "default" in extra:
            extra["default"] = self.show_default
        elif (self.show_default and "default" not in extra and self.is_bool_flag and not self.secondary_opts
              and self.get_default(ctx, call=False) is False):
            extra["default"] = "off"  # click shows nothing for a flag that is off
        return extra


def option(*decls, **attrs):
    """``click.option`` with :class:`Option` (every ctpore option has help and shows its default)."""
    attrs.setdefault("cls", Option)
    return click.option(*decls, **attrs)


def tmp_dir_option(f):
    """``--tmp-dir`` (reconstruct, batch): where a run's temporary volumes go."""
    return option("--tmp-dir", type=click.Path(path_type=Path), default=None, show_default="the output folder",
                  help="Existing folder for a run's temporary files: the raw probabilities (4 bytes a voxel), an "
                       "uncompressed copy of a compressed scan, the slabs of outputs in another axis order. The "
                       "free space there and in the output folder is checked before any work.")(f)


def sample_margin_option(f):
    """``--sample-margin`` (reconstruct, batch): erode the sample by N voxels."""
    return option("--sample-margin", type=click.IntRange(0), default=0, show_default=True,
                  help="Erode the sample (found or given) by this many voxels within each slice, from its surface "
                       "(a cut face at the slice's edge stays): users often drop a damaged rim.")(f)


def output_format_option(f):
    """``--output-format`` (reconstruct, batch): NIfTI files or OME-Zarr stores."""
    from ctpore.pipelines.output_formats import DEFAULT_OUTPUT_FORMAT, OUTPUT_FORMATS

    return option("--output-format", type=click.Choice(list(OUTPUT_FORMATS)), default=DEFAULT_OUTPUT_FORMAT,
                  show_default=True,
                  help="How the volumes are written: nifti (<stem>_pores.nii.gz, ...) or ome-zarr "
                       "(<stem>_pores.ome.zarr, ...: multiscale stores that napari opens lazily, for scans above a "
                       "few GB).")(f)


SLICE_AXIS_HELP = "The file's voxel axis that holds the slices (NIfTI: 0, 1 or 2; a TIFF stack's slices are its pages)."


def parse_shape(text: str, option: str) -> tuple[int, int, int]:
    """``"128x512x512"`` as ``(128, 512, 512)``; an :class:`InputError` naming ``option`` otherwise."""
    try:
        dims = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) < 1:
        raise InputError(f"{option} must be Z x Y x X, like 128x512x512; got {text!r}")
    return dims  # type: ignore[return-value]


# -- the method options that reconstruct and batch share ------------------------------------------


def reconstruct_default(key):
    """The default of ``key`` in configs/reconstruct.yaml (read when a command runs)."""
    from ctpore.pipelines.reconstruct import DEFAULTS

    return DEFAULTS[key]


#: The defaults of configs/reconstruct.yaml as --help shows them (tests check they agree).
SHOWN_DEFAULTS = {"method": "auto", "device": "cpu", "memory_gb": "1.5", "precision": "auto"}


class MethodChoice(click.Choice):
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


def method_choice() -> click.Choice:
    """``--method``'s choices (:class:`MethodChoice`)."""
    return MethodChoice()


def method_help() -> str:
    """``--method``'s help: every registered method with its description."""
    from ctpore.pipelines.methods import METHODS

    return ("auto = poreformer when its weights are installed, else otsu. "
            + "; ".join(f"{s.name}: {s.description}" for s in METHODS.values()) + ".")


def typed_command(ctx: click.Context) -> str:
    """The command as the user typed it, for a report to say what wrote it: the command's path and
    the options given on the command line (those left at their defaults left out), long names."""
    from click.core import ParameterSource

    parts = [ctx.command_path]
    for param in ctx.command.params:
        if ctx.get_parameter_source(param.name) != ParameterSource.COMMANDLINE:
            continue
        name, value = max(param.opts, key=len), ctx.params[param.name]
        if getattr(param, "is_flag", False):
            parts.append(name)
        elif not param.opts[0].startswith("-"):  # an argument
            parts.append(str(value))
        else:
            parts.append(f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}")
    return " ".join(parts)
