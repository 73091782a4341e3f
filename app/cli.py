"""The ``ctpore`` command. Thin: parse, call a pipeline, print.

Exit codes: 0 done; 2 bad input or usage (one line on stderr naming the file and what is wrong);
1 internal error; ``batch``: 3 when some scans failed and the rest were done.
"""

from __future__ import annotations

import gc
import os
import sys
import warnings

import click

from ctpore.version import __version__
from ctpore.app.analyze_cli import analyze
from ctpore.app.attention_cli import attention
from ctpore.app.batch_cli import batch
from ctpore.app.bench_cli import bench
from ctpore.app.evaluate_cli import evaluate
from ctpore.app.finetune_cli import finetune
from ctpore.app.info_cli import info
from ctpore.app.reconstruct_cli import reconstruct
from ctpore.app.simulate_cli import simulate
from ctpore.app.train_cli import train
from ctpore.app.console import EXIT_INPUT, EXIT_INTERNAL, EXIT_OK
from ctpore.app.console import error as _error
from ctpore.app.console import resource_error as _resource_error
from ctpore.app.console import show_warning as _show_warning
from ctpore.errors import InputError
from ctpore.runtime import quiet_openmp, tune_allocator


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ctpore")
def cli() -> None:
    """ctpore: the 3D pore space of soil and rock from X-ray micro-CT scans.

    Exit codes of every command: 0 done; 2 bad input or usage (one line on stderr that names the
    file and what is wrong); 1 internal error; batch: 3 when some scans failed and the rest were done.
    """


for _command in (reconstruct, analyze, batch, evaluate, info, simulate, train, finetune, attention,
                 bench):  # each in app/<name>_cli.py
    cli.add_command(_command)


def main(argv=None) -> None:
    """Entry point of the ``ctpore`` console script (``argv`` None: the command is the whole process)."""
    # Reuse freed memory instead of faulting in fresh pages for every chunk's activations
    # (ctpore.runtime says why). Process-wide, so the command sets it, never the library.
    tune_allocator()
    quiet_openmp()  # before torch loads: idle OpenMP threads sleep (ctpore.runtime says why)
    warnings.showwarning = _show_warning  # ctpore's warnings as one line each, on stderr
    try:
        _main(argv)
    finally:
        if argv is None:
            # The process ends next. Its last garbage collections would walk every object torch
            # and scipy made (about 0.45 s of a 7 s reconstruct, on 2 cores); frozen, they are
            # skipped, and the exit still runs every atexit handler, finalizer and flush.
            gc.freeze()


def _main(argv) -> None:
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
