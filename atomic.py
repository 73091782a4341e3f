"""Files written whole or not at all: the one write-to-temp-then-rename helper, for every layer.

Every file ctpore writes (volumes, metrics, weights, checkpoints, reports, manifests) goes through
:func:`atomic_write`: the writer fills a temporary file beside the destination, which is renamed
over the destination only when the writer returned without an error, and removed otherwise. A
reader (or a resumed batch run) never meets half a file, and an interrupted run leaves none.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ctpore.errors import InputError

__all__ = ["atomic_write", "host_tag", "owner_tag", "parse_owner", "temp_parts", "write_json_atomic",
           "write_lines_atomic"]


def host_tag() -> str:
    """This host as an owned temporary file's name carries it: 12 hex digits of its name's SHA-1
    (hosts whose names differ never share one; containers that share a host name and not their
    process table count as one host, as for the output locks)."""
    return hashlib.sha1(socket.gethostname().encode("utf-8", "surrogateescape")).hexdigest()[:12]


def owner_tag() -> str:
    """``<host>-<pid>`` of this process (:func:`host_tag`), as an owned temporary's name carries it."""
    return f"{host_tag()}-{os.getpid()}"


def parse_owner(name: str) -> tuple[str, int] | None:
    """``(host, pid)`` of an owned temporary file's name (see :func:`atomic_write`), else None."""
    m = re.search(r"\.tmp-([0-9a-f]{12})-([1-9][0-9]{0,9})-[0-9a-f]{8}", name)
    return (m.group(1), int(m.group(2))) if m else None


def temp_parts(name: str) -> tuple[str, str]:
    """``(stem, suffix)`` of a file name as its temporaries are named ``.<stem>.tmp-...<suffix>``
    (``.nii.gz`` is one suffix, so that writers choosing the format by name write the right one)."""
    suffix = name[-7:] if name.lower().endswith(".nii.gz") and len(name) > 7 else Path(name).suffix
    return (name[: len(name) - len(suffix)] if suffix else name), suffix


def _chmod_default(path: str | os.PathLike) -> None:
    """Give a file the permissions a plain ``open()`` would (0666 less the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


@contextmanager
def atomic_write(path: str | os.PathLike, owned: bool = False) -> Iterator[Path]:
    """Write a file whole or not at all: yield a temporary path, rename it to ``path`` at the end.

    The temporary file ``.<stem>.tmp-XXXXXXXX<suffix>`` lies in the destination's folder (so the
    rename is atomic) and keeps its suffix (writers that choose the format by name, such as
    nibabel for ``.nii.gz``, write the right one). It is created empty; the caller writes it
    (replacing it is fine), and it ends with the permissions a plain ``open()`` gives. When the
    block ends without an error the file is flushed to disk and renamed over ``path``; on any
    error (or an interruption) it is removed and the error propagates. An existing ``path`` is
    untouched until the rename.

    A file that several runs rewrite in one folder (a batch's summary) is written ``owned``: its
    temporary is ``.<stem>.tmp-<host>-<pid>-XXXXXXXX<suffix>`` (:func:`owner_tag`), so that one a
    killed run left can be told from one a live run is writing
    (:func:`ctpore.pipelines.claims.remove_orphan_temps`).

    Raises
    ------
    InputError
        When the folder does not exist, is not a folder, or a file cannot be created in it.

    Examples
    --------
    >>> with atomic_write(folder / "table.csv") as tmp:      # doctest: +SKIP
    ...     tmp.write_bytes(data)
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is not a folder"
        raise InputError(f"cannot write {path.name}: the output folder {what}", folder)
    stem, suffix = temp_parts(path.name)
    tag = f"{owner_tag()}-" if owned else ""
    tmp = folder / f".{stem}.tmp-{tag}{secrets.token_hex(4)}{suffix}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        os.close(fd)
    except OSError as exc:
        raise InputError(f"cannot write {path.name} in this folder ({exc.strerror or exc})", folder) from exc
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        _chmod_default(tmp)  # a writer that recreated the file may have left it private (0600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON (with a final newline) to ``path``, whole or not at all."""
    path = Path(path)
    with atomic_write(path) as tmp:
        with open(tmp, "w") as fh:
            json.dump(obj, fh, indent=2)
            fh.write("\n")
    return path


def write_lines_atomic(path: str | os.PathLike, lines: list[str]) -> Path:
    """Write ``lines`` (a report's Markdown, say), one per line with a final newline, to ``path``,
    whole or not at all."""
    path = Path(path)
    with atomic_write(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n")
    return path
