"""The wall-time model of ``docs/scale.md`` (CPU and GPU nodes) against hand arithmetic, and the
pages that ``--rewrite`` writes again from the measured JSON without measuring."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import ctpore
from ctpore.pipelines.bench.split import cpu_rates, gpu_rates, scale_model
from helpers import run_cli

DOCS = Path(ctpore.__file__).parent / "docs"


def measured(slab_seconds=(10.0, 12.0), warm=(0, 8), post=4.0, serial=1.0) -> dict:
    """A 1-worker split of a 64 x 32 x 32 scan in two slabs of 32 slices, the second with 8 warm-up slices."""
    return {"shape_zyx": [64, 32, 32], "store_align": 16, "reach_slices": 8,
            "split": {"1": {"slabs": 2, "slab_slices": 32, "slab_seconds": list(slab_seconds),
                            "slab_warm_up_slices": list(warm),
                            "stage_seconds": {"postprocess_and_write": post, "sample_and_range": serial}}}}


def test_this_machines_rates_are_the_splits_seconds_over_the_voxels_it_computed():
    r = cpu_rates(measured())
    assert r["predict"] == pytest.approx(22.0 / ((32 + 32 + 8) * 1024))  # the warm-up counts as computed
    assert r["post"] == pytest.approx(4.0 / (64 * 1024))
    assert r["serial_per_plane_voxel"] == pytest.approx(1.0 / 1024)


def test_one_node_is_the_serial_part_then_every_voxel_once_and_n_nodes_add_their_warm_up():
    rates = {"predict": 2e-6, "post": 1e-6, "serial_per_plane_voxel": 1e-4}
    one = scale_model(measured(), 256, 1, rates)
    assert one["warm_up_share"] == 0 and one["slabs"] == 1
    assert one["hours"] == round((1e-4 * 256**2 + 256**3 * 3e-6) / 3600, 2)
    four = scale_model(measured(), 256, 4, rates)  # 4 slabs of 64, each but the first warms up 8 slices
    assert four["slab_slices"] == 64 and four["warm_up_share"] == pytest.approx(8 / 64)
    assert four["hours"] == round((1e-4 * 256**2 + (64 + 8) * 256**2 * 2e-6 + 64 * 256**2 * 1e-6) / 3600, 2)


def test_a_gpu_nodes_rates_are_its_model_alone_and_the_rest_of_its_whole_run():
    gpu = {"versions": {"gpu": "G"}, "speed": {"voxels_per_s": 1e8},
           "reconstruct": {"voxels": 1_000_000, "seconds_in_metrics": 0.5}}
    r = gpu_rates(gpu, {"serial_per_plane_voxel": 3e-4})
    assert r["predict"] == pytest.approx(1e-8)
    assert r["post"] == pytest.approx(0.5e-6 - 1e-8)  # what the model did not take of the whole run
    assert r["serial_per_plane_voxel"] == 3e-4 and r["gpu"] == "G"
    assert gpu_rates({"speed": gpu["speed"]}, {}) is None  # a partial bench gives no model


def test_the_scale_page_is_written_again_from_its_json_with_and_without_gpu_figures(tmp_path, capsys):
    shutil.copy(DOCS / "scale.json", tmp_path / "scale.json")
    code, out, err = run_cli(["bench", "split", "--rewrite", "-o", tmp_path], capsys)
    assert code == 0, err
    page = (tmp_path / "scale.md").read_text()
    assert "On GPUs: not modelled yet" in page and "| GPU nodes |" not in page
    cpu_model = json.loads((tmp_path / "scale.json").read_text())["model"]
    for m in cpu_model:
        assert f"| {m['side']}^3 | {m['nodes']} | {m['slab_slices']} |" in page
    (tmp_path / "gpu.json").write_text(json.dumps({"versions": {"gpu": "Some GPU"}, "speed": {"voxels_per_s": 1e8},
                                                   "reconstruct": {"voxels": 10**6, "seconds_in_metrics": 0.5}}))
    code, out, err = run_cli(["bench", "split", "--rewrite", "-o", tmp_path], capsys)
    assert code == 0, err
    res = json.loads((tmp_path / "scale.json").read_text())
    page = (tmp_path / "scale.md").read_text()
    assert res["model"] == cpu_model and len(res["gpu_model"]) == len(cpu_model)
    assert "Some GPU" in page and "| GPU nodes |" in page
    for m in res["gpu_model"]:
        assert f"| {m['side']}^3 | {m['nodes']} | {m['slab_slices']} | {100 * m['warm_up_share']:.0f}% | " \
               f"{m['hours']} |" in page
    assert all(g["hours"] < c["hours"] for g, c in zip(res["gpu_model"], cpu_model))  # its GPU is faster here


@pytest.mark.parametrize("name, page", [("speed", "performance.json"), ("split", "scale.json")])
def test_rewrite_without_the_measured_json_is_one_line_and_exit_2(tmp_path, capsys, name, page):
    code, out, err = run_cli(["bench", name, "--rewrite", "-o", tmp_path], capsys)
    assert code == 2 and page in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_the_performance_page_rewritten_keeps_its_command_and_takes_the_gpu_section(tmp_path, capsys):
    shutil.copy(DOCS / "performance.json", tmp_path / "performance.json")
    res = json.loads((tmp_path / "performance.json").read_text())
    code, _out, err = run_cli(["bench", "speed", "--rewrite", "-o", tmp_path], capsys)
    assert code == 0, err
    page = (tmp_path / "performance.md").read_text()
    assert f"Reproduce: `{res['command']}`" in page and "No CUDA GPU was available" in page
    shutil.copy(DOCS / "gpu.json", tmp_path / "gpu.json")
    run_cli(["bench", "speed", "--rewrite", "-o", tmp_path], capsys)
    page = (tmp_path / "performance.md").read_text()
    gpu = json.loads((DOCS / "gpu.json").read_text())
    assert "No CUDA GPU was available" not in page and gpu["versions"]["gpu"] in page
    assert f"{gpu['speed']['voxels_per_s']:.3g}" in page


def test_the_split_benchs_timed_scripts_report_through_a_file_and_a_failed_one_says_so():
    # the child's report is a file it writes, not a line of its stdout, which the run's own output shares
    from ctpore.pipelines.bench import split as bench

    got = bench._run("import json, resource, sys\nprint('RESULT {}')\nwall = 0.25\nr = {'result': {'porosity': 0.3}}\n")
    assert got["wall"] == 0.25 and got["metrics"] == {"porosity": 0.3} and got["cpu"] > 0
    with pytest.raises(RuntimeError, match="the timed run failed"):
        bench._run("import sys\nraise SystemExit('no scan here')\n")
