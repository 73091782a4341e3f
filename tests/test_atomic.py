"""Files are written whole or not at all (ctpore.atomic)."""

from __future__ import annotations

import os
import stat

import pytest

from ctpore.atomic import atomic_write, write_json_atomic
from ctpore.errors import InputError


def test_success_replaces_the_file_with_default_permissions(tmp_path):
    dest = tmp_path / "table.nii.gz"
    dest.write_bytes(b"old")
    with atomic_write(dest) as tmp:
        assert tmp.parent == tmp_path and tmp.name.endswith(".nii.gz")  # writers see the format
        assert dest.read_bytes() == b"old"  # untouched until the block ends
        tmp.unlink()  # a writer may recreate the file (with private permissions)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"new")
        os.close(fd)
    assert dest.read_bytes() == b"new"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.nii.gz"]


def test_an_error_or_interruption_leaves_the_old_file_and_no_temp(tmp_path):
    dest = tmp_path / "m.json"
    dest.write_text("{}")
    for exc in (OSError(28, "No space left on device"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with atomic_write(dest) as tmp:
                tmp.write_text('{"half": ')
                raise exc
        assert dest.read_text() == "{}"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]


def test_a_missing_folder_is_an_input_error_naming_it(tmp_path):
    with pytest.raises(InputError, match="output folder does not exist"):
        with atomic_write(tmp_path / "nope" / "x.json"):
            pass


def test_write_json_atomic(tmp_path):
    path = write_json_atomic(tmp_path / "a.json", {"b": [1, 2]})
    assert path.read_text() == '{\n  "b": [\n    1,\n    2\n  ]\n}\n'
