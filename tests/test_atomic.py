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


def test_a_killed_writers_owned_temp_is_removed_and_a_live_ones_kept(tmp_path, monkeypatch):
    """A batch killed while rewriting its summary leaves ``.batch_summary.tmp-<host>-<pid>-...``;
    the next run removes it, but never the temporary of a run still writing, nor one of another host."""
    import subprocess
    import sys

    from ctpore.atomic import host_tag, owner_tag, parse_owner
    from ctpore.pipelines.batch_summary import BatchSummary
    from ctpore.pipelines.claims import remove_orphan_temps

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its pid names no process
    host = host_tag()
    target = tmp_path / "batch_summary.csv"
    orphan = tmp_path / f".batch_summary.tmp-{host}-{dead.pid}-0a1b2c3d.csv"
    live = tmp_path / f".batch_summary.tmp-{owner_tag()}-0a1b2c3e.csv"
    remote = tmp_path / f".batch_summary.tmp-{'0' * 12 if host != '0' * 12 else '1' * 12}-{dead.pid}-0a1b2c3f.csv"
    huge = tmp_path / f".batch_summary.tmp-{host}-99999999999999999999-0a1b2c42.csv"  # no such pid can exist
    unowned = tmp_path / ".batch_summary.tmp-0a1b2c40.csv"
    other = tmp_path / f".g0_metrics.tmp-{host}-{dead.pid}-0a1b2c41.json"
    for p in (orphan, live, remote, unowned, other, huge):
        p.write_text("half")
    assert parse_owner(orphan.name) == (host, dead.pid) and parse_owner(unowned.name) is None
    assert parse_owner(huge.name) is None  # not a pid: left alone, and nothing crashes on it
    assert remove_orphan_temps(target) == 1
    assert not orphan.exists() and live.exists() and remote.exists() and unowned.exists() and other.exists()

    # the summary is written owned, and a new batch's summary clears what a killed one left
    orphan.write_text("half")
    (tmp_path / "batch_report.jsonl").write_text("")
    summary = BatchSummary(tmp_path, tmp_path / "batch_report.jsonl")
    assert not orphan.exists()
    seen = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (seen.append(os.path.basename(a)), real_replace(a, b))[1])
    summary.write()
    assert seen and parse_owner(seen[0]) == (host, os.getpid())


def test_owned_temporaries_are_named_as_the_cleanup_looks_for_them(tmp_path):
    from ctpore.atomic import host_tag, parse_owner, temp_parts
    from ctpore.pipelines.claims import remove_orphan_temps

    assert temp_parts("scan.nii.gz") == ("scan", ".nii.gz")
    assert temp_parts("batch_summary.csv") == ("batch_summary", ".csv")
    assert temp_parts("README") == ("README", "")
    for name in ("scan.nii.gz", "batch_summary.csv"):
        with atomic_write(tmp_path / name, owned=True) as tmp:
            stem, suffix = temp_parts(name)
            assert tmp.name.startswith(f".{stem}.tmp-") and tmp.name.endswith(suffix)
            assert parse_owner(tmp.name) == (host_tag(), os.getpid())
            assert remove_orphan_temps(tmp_path / name) == 0 and tmp.exists()  # its writer runs: kept
            tmp.write_bytes(b"whole")
        assert (tmp_path / name).read_bytes() == b"whole"
