"""Seed ranges of the splits: no config reaches another split's scans, and the benchmark simulates
only held-out seeds, while the shipped configs and the documented bench commands keep their seeds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ctpore.data import splits
from ctpore.errors import InputError
from ctpore.pipelines.train import config_from_dict, load_train_config

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("train", "train_unet2d", "train_unet3d")


def _config_file(tmp_path: Path, **data) -> Path:
    """configs/train.yaml with ``data`` keys changed, written to ``tmp_path``."""
    raw = yaml.safe_load((ROOT / "configs" / "train.yaml").read_text())
    raw["data"].update(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CTPORE_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "ctpore.app.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


# ---- refused: each through the real config loader or bench function ---------------------------------

def test_data_seed_in_the_benchmark_range_is_refused(tmp_path):
    path = _config_file(tmp_path, seed=1_000_000, n_train=256)
    with pytest.raises(InputError) as err:
        load_train_config(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: ")
    assert "training seeds 1000000000000..1000000000255 (data.seed 1000000, n_train 256)" in msg
    assert "the benchmark's held-out seeds 1000000000000.." in msg
    assert "choose data.seed below 1000000" in msg


def test_n_train_running_into_the_validation_range_is_refused(tmp_path):
    with pytest.raises(InputError) as err:
        load_train_config(_config_file(tmp_path, n_train=600_000))
    msg = str(err.value)
    assert "training seeds 1000000..1599999 (data.seed 1, n_train 600000)" in msg
    assert "validation seeds 1500000..1500047" in msg  # n_val 12, and 48 at export
    assert "n_train at most 500000" in msg


def test_the_largest_n_train_and_n_val_are_accepted_and_one_more_is_not():
    ok = config_from_dict({"data": {"seed": 3, "n_train": splits.VAL_OFFSET,
                                    "n_val": splits.SEED_STRIDE - splits.VAL_OFFSET}})
    assert ok.data.n_train == 500_000
    with pytest.raises(InputError, match="n_train at most 500000"):
        config_from_dict({"data": {"seed": 3, "n_train": splits.VAL_OFFSET + 1}})
    with pytest.raises(InputError, match=r"validation seeds 3500000\.\.4000000 .* overlap training seeds 4000000\.\."):
        config_from_dict({"data": {"seed": 3, "n_val": splits.SEED_STRIDE - splits.VAL_OFFSET + 1}})
    # validation of data.seed 1 running into the further held-out block names that block
    with pytest.raises(InputError, match="overlap the further held-out seeds 2000000..2999999"):
        config_from_dict({"data": {"seed": 1, "n_val": 600_000}})
    # the last data.seed below the benchmark: accepted; its validation may not reach the benchmark
    assert config_from_dict({"data": {"seed": 999_999}}).data.seed == 999_999
    with pytest.raises(InputError, match="overlap the benchmark's held-out seeds"):
        config_from_dict({"data": {"seed": 999_999, "n_val": 600_000}})


def test_the_further_held_out_block_is_no_training_seed(tmp_path):
    with pytest.raises(InputError) as err:
        load_train_config(_config_file(tmp_path, seed=2))
    msg = str(err.value)
    assert "training seeds 2000000..2000191 (data.seed 2, n_train 192)" in msg
    assert "the further held-out seeds 2000000..2999999" in msg and "choose another data.seed" in msg


@pytest.mark.parametrize("bad", [-1, 1.5, "1", True, None])
def test_negative_or_non_integer_data_seed_is_refused(tmp_path, bad):
    path = _config_file(tmp_path, seed=bad)
    with pytest.raises(InputError, match="data.seed must be a whole number >= 0") as err:
        load_train_config(path)
    assert err.value.path == path


@pytest.mark.parametrize("key", ["n_train", "n_val"])
def test_negative_counts_are_refused(key):
    with pytest.raises(InputError, match=f"data.{key} must be a whole number >= 0"):
        config_from_dict({"data": {key: -1}})


@pytest.mark.parametrize("seed_base, n_sim, names", [
    (1_000_000, 8, "training seeds 1000000..1499999 (data.seed 1"),      # the shipped configs' training
    (1_500_000, 1, "validation seeds 1500000..1999999 (data.seed 1"),    # ... and validation seeds
    (0, 4, "training seeds 0..499999 (data.seed 0"),
    (2_999_990, 40, "training seeds 3000000..3499999 (data.seed 3"),     # runs out of the further block
    (10**12 - 4, 8, "validation seeds 999999500000..999999999999"),      # runs into the benchmark from below
])
def test_bench_seed_range_a_config_can_reach_is_refused_before_anything_runs(monkeypatch, seed_base, n_sim, names):
    from ctpore.pipelines.bench import quality

    def never(*args, **kwargs):
        raise AssertionError("weights loaded or a scan simulated before the seeds were checked")

    monkeypatch.setattr(quality, "Runner", never)
    monkeypatch.setattr(quality, "make_pair", never)
    with pytest.raises(InputError) as err:
        quality.bench_quality(n_sim=n_sim, size=16, methods=("otsu",), seed_base=seed_base)
    msg = str(err.value)
    last = seed_base + n_sim - 1
    assert f"the benchmark's simulated seeds {seed_base}..{last} (--seed-base {seed_base}, --n-sim {n_sim})" in msg
    assert names in msg and "--seed-base 1000000000000 or more" in msg
    with pytest.raises(InputError):
        next(quality.bench_cases(n_sim=n_sim, size=16, seed_base=seed_base))


def test_negative_bench_seed_base_is_refused():
    with pytest.raises(InputError, match="the seed base must be a whole number >= 0"):
        splits.check_bench_seeds(-1, 1)


# ---- refused through the command line: exit 2, one line naming both ranges, nothing written ----------

def test_train_cli_refuses_an_overlapping_config_in_one_line_and_writes_nothing(tmp_path):
    path = _config_file(tmp_path, seed=1_000_000, n_train=256)
    before = sorted(tmp_path.rglob("*"))
    proc = _cli("train", "--config", str(path), "--run-dir", str(tmp_path / "run"),
                "--export", str(tmp_path / "w.safetensors"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith(f"ctpore: error: {path}: training seeds 1000000000000..1000000000255")
    assert "the benchmark's held-out seeds 1000000000000.." in lines[0]
    assert proc.stdout == ""
    assert sorted(tmp_path.rglob("*")) == before  # no run folder, no checkpoint, no weights


def test_bench_cli_refuses_a_training_seed_range_in_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    proc = _cli("bench", "quality", "--n-sim", "2", "--size", "16", "--seed-base", "1000000",
                "--simulated-only", "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith("ctpore: error: the benchmark's simulated seeds 1000000..1000001")
    assert "training seeds 1000000..1499999 (data.seed 1" in lines[0]
    assert not out.exists() and list(tmp_path.iterdir()) == []


# ---- accepted: the shipped configs and the documented commands keep their seeds ----------------------

@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_load_with_the_seeds_they_were_trained_on(name):
    cfg = load_train_config(ROOT / "configs" / f"{name}.yaml")
    training, validation = splits.config_ranges(cfg.data.seed, cfg.data.n_train, cfg.data.n_val)
    assert (cfg.data.seed, cfg.data.n_train, cfg.data.n_val) == (1, 192, 12)
    assert list(range(training.start, training.stop)) == [1_000_000 + i for i in range(192)]
    assert list(range(validation.start, validation.stop)) == [1_500_000 + i for i in range(48)]  # 48 at export
    assert [splits.train_seed(1, i) for i in (0, 191)] == [1_000_000, 1_000_191]
    assert [splits.val_seed(1, i) for i in (0, 11)] == [1_500_000, 1_500_011]


@pytest.mark.parametrize("seed_base, n_sim", [
    (None, 8),            # ctpore bench quality
    (2_000_100, 40),      # ctpore bench quality --n-sim 40 --seed-base 2000100 --simulated-only
    (2_300_100, 40),      # ... --seed-base 2300100 --zoom-max 3 --simulated-only
])
def test_documented_bench_commands_keep_their_seeds(monkeypatch, seed_base, n_sim):
    from ctpore.pipelines.bench import quality

    first = 10**12 if seed_base is None else seed_base  # the CLI passes BENCH_SEED_BASE without --seed-base
    expected = [first + i for i in range(n_sim)]
    assert splits.BENCH_SEED_BASE == 10**12
    cases = splits.check_bench_seeds(first, n_sim)
    assert list(range(cases.start, cases.stop)) == expected
    drawn = []

    def record(seed, shape, zoom=1.0):  # the seed bench_cases takes; no scan is simulated
        drawn.append(seed)
        return np.zeros(1, np.uint8), np.zeros(1, np.uint8), {}

    monkeypatch.setattr(quality, "make_pair", record)
    kwargs = {} if seed_base is None else {"seed_base": seed_base}
    assert len(list(quality.bench_cases(n_sim=n_sim, size=16, **kwargs))) == n_sim
    assert drawn == expected


@pytest.mark.parametrize("report", ["benchmark.json", "further/benchmark.json"])
def test_the_recorded_reports_cases_are_still_the_cases_simulated(report):
    """The first cases of docs/benchmark.json and docs/further/benchmark.json (written by the documented
    commands) are what their seed base simulates today: same family and porosity."""
    import itertools
    import json

    from ctpore.pipelines.bench import bench_cases

    path = ROOT / "docs" / report
    if not path.exists():
        pytest.skip(f"no docs/{report}")
    res = json.loads(path.read_text())
    recorded = list(dict.fromkeys(r["case"] for r in res["rows"]))[:2]
    now = [name for name, _scan, _truth in itertools.islice(
        bench_cases(n_sim=res["n_sim"], size=res["size"], seed_base=res["seed_base"],
                    zoom_max=res.get("zoom_max", 1.0)), 2)]
    assert now == recorded


def test_documented_bench_seeds_lie_in_the_held_out_ranges_no_config_reaches():
    assert splits.bench_range(10**12, 8).within(splits.BENCHMARK)
    for base in (2_000_100, 2_300_100):
        assert splits.bench_range(base, 40).within(splits.FURTHER)
    for name in [f"{n}{stage}" for n in SHIPPED for stage in ("", "_continued", "_stage3")]:  # every training stage
        cfg = load_train_config(ROOT / "configs" / f"{name}.yaml")
        for r in splits.config_ranges(cfg.data.seed, cfg.data.n_train, cfg.data.n_val):
            assert not r.overlaps(splits.FURTHER) and not r.overlaps(splits.BENCHMARK)


def test_seed_range_arithmetic():
    r = splits.SeedRange("x", 10, 20)
    assert 10 in r and 19 in r and 20 not in r and 9 not in r
    assert r.overlaps(splits.SeedRange("y", 19, 30)) and not r.overlaps(splits.SeedRange("y", 20, 30))
    assert not r.overlaps(splits.SeedRange("empty", 15, 15))
    assert r.overlaps(splits.SeedRange("open", 0)) and not r.overlaps(splits.SeedRange("open", 20))
    assert str(r) == "x 10..19" and str(splits.BENCHMARK) == "the benchmark's held-out seeds 1000000000000.."
    with pytest.raises(InputError, match=r"^a 0\.\.4 overlap b 4\.\.9; do this$"):
        splits.check_disjoint(splits.SeedRange("a", 0, 5), splits.SeedRange("b", 4, 10), "do this")
    splits.check_disjoint(splits.SeedRange("a", 0, 5), splits.SeedRange("b", 5, 10))


# ---- the rule itself: whatever is accepted is disjoint -----------------------------------------------

_seed = st.integers(0, splits.BENCH_SEED_BASE // splits.SEED_STRIDE + 5)
_count = st.integers(0, 700_000)


def _accepted(seed, n_train, n_val):
    try:
        return splits.check_config_seeds(seed, n_train, n_val)
    except InputError:
        return None


@settings(max_examples=300, deadline=None)
@given(a=st.tuples(_seed, _count, _count), b=st.tuples(_seed, _count, _count),
       bench=st.tuples(st.one_of(st.integers(0, 2 * splits.BENCH_SEED_BASE),
                                 st.integers(splits.FURTHER_SEED_BASE - 10, splits.FURTHER_SEED_STOP + 10)),
                       st.integers(0, 2_000_000)))
def test_accepted_ranges_never_overlap(a, b, bench):
    ra, rb = _accepted(*a), _accepted(*b)
    for ranges in (ra, rb):
        if ranges is not None:
            assert not ranges[0].overlaps(ranges[1])
            for r in ranges:
                assert not r.overlaps(splits.BENCHMARK) and not r.overlaps(splits.FURTHER)
    if ra is not None and rb is not None and a[0] != b[0]:
        assert not any(x.overlaps(y) for x in ra for y in rb)
    try:
        cases = splits.check_bench_seeds(*bench)
    except InputError:
        return
    for ranges in (ra, rb):
        if ranges is not None:
            assert not any(cases.overlaps(r) for r in ranges)


def test_a_data_config_built_without_the_loader_is_checked_before_any_scan_is_simulated(monkeypatch):
    from ctpore.pipelines.train import DataConfig, batches

    def never(*args, **kwargs):
        raise AssertionError("a scan was simulated before the seeds were checked")

    monkeypatch.setattr(batches, "make_pair", never)
    with pytest.raises(InputError, match="overlap the benchmark's held-out seeds"):
        batches.simulated_pool(DataConfig(seed=1_000_000, n_train=2, n_val=1, volume_size=16))
    with pytest.raises(InputError, match="overlap validation seeds"):
        batches.simulated_pool(DataConfig(n_train=600_000, volume_size=16), val=True)
