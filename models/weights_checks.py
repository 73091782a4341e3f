"""What a weights file must be before its tensors are used: safetensors, and fitting the model.

Only a file's first bytes decide whether it is safetensors (nothing is ever unpickled): a
pickle-based checkpoint (``torch.save``'s zip or a plain pickle) is refused with the advice of
how to convert it, anything else without a safetensors header is called what it is. Tensors
that do not fit the model built from a file's config are refused in one short line. The loaders
of :mod:`ctpore.models.weights` run both checks.
"""

from __future__ import annotations

import struct
from pathlib import Path

from ctpore.errors import InputError

__all__ = ["check_fit", "check_safetensors"]

_PICKLE_SUFFIXES = {".pt", ".pth", ".ckpt", ".pkl", ".pickle"}
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on the JSON header


def _refuse(path: Path, why: str) -> InputError:
    """A pickle-based checkpoint (``torch.save``'s zip or a plain pickle): say how to convert it."""
    return InputError(
        f"is not a safetensors file ({why}); ctpore never unpickles weights (it could run "
        "code). Convert it with ctpore.models.weights.save_weights in an environment you "
        "trust: build PoreFormer(config), load_state_dict(torch.load(path, weights_only=True)), "
        "then save_weights(model, 'poreformer.safetensors')",
        path=path,
    )


def _not_weights(path: Path, why: str = "its first bytes are not a safetensors header") -> InputError:
    """Neither safetensors nor a pickle checkpoint: no conversion advice applies."""
    return InputError(f"is not a safetensors file ({why}): pass the .safetensors weights ctpore wrote",
                      path=path)


def check_safetensors(path: str | Path) -> Path:
    """Refuse what is not a readable safetensors file, with a message that says why.

    Only the first bytes are looked at (nothing is unpickled): a zip archive (``torch.save``) or
    a pickle header gets the conversion advice; anything else without a safetensors header (8-byte
    little-endian header length, then ``{``) is called what it is, whatever its suffix.
    """
    p = Path(path)
    if not p.exists():
        raise InputError("no such weights file", path=p)
    if p.is_dir():
        raise InputError("is a directory, expected a .safetensors weights file", path=p)
    try:
        with open(p, "rb") as fh:
            head = fh.read(8)
            size = p.stat().st_size
            if head[:4] == b"PK\x03\x04":
                raise _refuse(p, "a zip archive, as torch.save writes")
            if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
                raise _refuse(p, "it starts with a pickle header")
            if not head:
                raise _not_weights(p, "the file is empty")
            if len(head) < 8:
                raise _not_weights(p, f"only {len(head)} bytes long")
            (n,) = struct.unpack("<Q", head)
            if n < 2 or n > _MAX_HEADER or 8 + n > size or fh.read(1) != b"{":
                if p.suffix.lower() in _PICKLE_SUFFIXES:
                    raise _not_weights(p, f"its first bytes are neither a safetensors header nor those of "
                                          f"a torch.save/pickle {p.suffix} checkpoint; is it damaged?")
                raise _not_weights(p)
    except OSError as exc:
        raise InputError(f"cannot read the weights file ({exc.strerror})", path=p) from exc
    return p


def check_fit(state: dict, expected: dict, path: Path, meta: dict | None = None, what: str = "stored config",
               advice: str = "") -> None:
    """One short line when the tensors of a file do not fit the model built from its config.

    It says how many tensors differ, the first two (expected vs found shape), and that the
    weights are for another model or config; never the whole list (a model has hundreds).
    """
    diffs = [f"missing {k}" for k in sorted(set(expected) - set(state))]
    diffs += [f"{k}: expected {tuple(expected[k].shape)}, found {tuple(state[k].shape)}"
              for k in sorted(set(state) & set(expected)) if tuple(state[k].shape) != tuple(expected[k].shape)]
    diffs += [f"unexpected {k}" for k in sorted(set(state) - set(expected))]
    if not diffs:
        return
    n = len(diffs)
    shown = "; ".join(diffs[:2]) + ("; ..." if n > 2 else "")
    written = ""
    if meta and meta.get("ctpore_version"):
        from ctpore.version import __version__

        if meta["ctpore_version"] != __version__:
            written = f" (written by ctpore {meta['ctpore_version']}, this is {__version__})"
    raise InputError(f"the tensors do not fit the {what}: {n} tensor{'s' if n != 1 else ''} differ ({shown}); "
                     f"these weights are for a different model or config{written}{advice}", path=path)
