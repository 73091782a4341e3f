"""Permeability and tortuosity on a cube of the pores (``ctpore analyze --flow``): the cube taken
inside the sample, the units and axes kept, the analytic tortuosity of straight channels, and
refusals in one line before any work."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from ctpore.errors import InputError
from ctpore.pipelines.flow import DARCY_M2, MAX_CUBE, MIN_CUBE, check_flow, choose_cube


def _needs_extra():
    pytest.importorskip("porespy", reason="the analysis extra (PoreSpy, OpenPNM) is not installed")
    pytest.importorskip("openpnm", reason="the analysis extra (PoreSpy, OpenPNM) is not installed")


def _tubes(n: int, centres, r: float, axis: int = 0) -> np.ndarray:
    """Straight round channels of radius ``r`` through a cube of side ``n`` along ``axis``."""
    yy, xx = np.mgrid[:n, :n] + 0.5
    disc = np.zeros((n, n), bool)
    for cy, cx in centres:
        disc |= (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
    im = np.broadcast_to(disc, (n, n, n)).copy()
    return np.moveaxis(im, 0, axis)


def _write(path, vol, spacing=(0.01, 0.01, 0.01), units=True):
    img = nib.Nifti1Image(np.ascontiguousarray(np.asarray(vol, np.uint8).T), np.diag([*spacing[::-1], 1.0]))
    img.header.set_xyzt_units("mm" if units else 0)
    nib.save(img, path)
    return path


# -- the cube ------------------------------------------------------------------------------------


def test_the_cube_lies_wholly_inside_a_cylindrical_core_about_its_centre():
    shape = (60, 90, 90)
    z, y, x = np.indices(shape)
    core = ((y - 50.5) ** 2 + (x - 40.5) ** 2 <= 30.0 ** 2).astype(np.uint8)  # off-centre, radius 30
    (z0, y0, x0), n = choose_cube(shape, core, 200)
    assert core[z0:z0 + n, y0:y0 + n, x0:x0 + n].all()
    assert 30 <= n <= 30 * np.sqrt(2)  # the largest square in the disc is 42 a side; shrunk by tenths
    assert abs(y0 + n / 2 - 51) <= 1 and abs(x0 + n / 2 - 41) <= 1  # about the core's axis


def test_without_a_sample_the_cube_is_the_volumes_centre_and_no_larger_than_asked():
    assert choose_cube((50, 80, 70), None, 32) == ((9, 24, 19), 32)
    assert choose_cube((20, 80, 70), None, 200) == ((0, 30, 25), 20)


def test_a_sample_with_no_solid_block_is_refused_in_words():
    shape = (30, 60, 60)
    z, y, x = np.indices(shape)
    ring = (np.abs(np.hypot(y - 29.5, x - 29.5) - 25) < 3).astype(np.uint8)  # a thin shell, no block
    with pytest.raises(InputError, match="no cube of 16 voxels"):
        choose_cube(shape, ring, 200)


def test_what_the_flow_cannot_do_is_refused_before_any_work(monkeypatch):
    with pytest.raises(InputError, match=f"at most {MAX_CUBE}"):
        check_flow(MAX_CUBE + 1, (0.01, 0.01, 0.01), True)
    with pytest.raises(InputError, match="cubic voxels"):
        check_flow(64, (0.02, 0.01, 0.01), True)
    monkeypatch.setitem(sys.modules, "openpnm", None)  # the extra not installed: import fails
    with pytest.raises(InputError, match=r"ctpore\[analysis\]"):
        check_flow(64, (0.01, 0.01, 0.01), True)


# -- the figures -------------------------------------------------------------------------------------


def test_straight_channels_have_tortuosity_one_and_no_flow_across():
    _needs_extra()
    from ctpore.pipelines.flow import flow_figures

    f = flow_figures(_tubes(40, [(10, 10), (30, 30)], 4.0), 0.01)
    assert f["tortuosity_zyx"][0] == pytest.approx(1.0, abs=0.01)  # analytic: a straight path
    assert f["permeability_zyx"][0] > 0
    assert f["permeability_darcy_zyx"][0] == pytest.approx(f["permeability_zyx"][0] / DARCY_M2, rel=1e-12)
    for key in ("permeability_zyx", "permeability_darcy_zyx", "tortuosity_zyx"):
        assert f[key][1:] == [None, None]  # no pore path across the channels


def test_wider_channels_conduct_more_and_the_permeability_goes_with_the_voxels_area():
    _needs_extra()
    from ctpore.pipelines.flow import flow_figures

    narrow = flow_figures(_tubes(40, [(20, 20)], 3.0), 0.01)["permeability_zyx"][0]
    wide = flow_figures(_tubes(40, [(20, 20)], 6.0), 0.01)["permeability_zyx"][0]
    coarse = flow_figures(_tubes(40, [(20, 20)], 3.0), 0.02)["permeability_zyx"][0]
    for k, r in ((narrow, 3.0), (wide, 6.0)):  # Hagen-Poiseuille: k = porosity r^2 / 8, r of the voxels' disc
        disc = _tubes(40, [(20, 20)], r)[0]
        poiseuille = disc.mean() * (np.sqrt(disc.sum() / np.pi) * 1e-5) ** 2 / 8
        assert k == pytest.approx(poiseuille, rel=0.3)  # the network's pyramids and cuboids idealize a tube
    assert coarse == pytest.approx(4 * narrow, rel=1e-6)  # k is an area: twice the voxel, four times k


def test_the_figures_follow_the_arrays_axes():
    _needs_extra()
    from ctpore.pipelines.flow import flow_figures

    for axis in range(3):  # the channels along Z, Y, X in turn: the figure moves with them
        f = flow_figures(_tubes(32, [(10, 10), (22, 22)], 3.5, axis=axis), None)
        assert [k is not None for k in f["permeability_zyx"]] == [a == axis for a in range(3)]
        assert f["tortuosity_zyx"][axis] == pytest.approx(1.0, abs=0.01)
        assert f["permeability_darcy_zyx"] == [None, None, None]  # units unknown: no darcy


def test_the_command_writes_the_flow_and_its_cube(tmp_path):
    _needs_extra()
    from click.testing import CliRunner

    from ctpore.app.cli import cli
    from ctpore.data.metrics import METRICS

    pores = np.zeros((48, 48, 48), np.uint8)
    pores[:, 20:28, 20:28] = 1  # a square channel along Z
    _write(tmp_path / "rock_pores.nii.gz", pores)
    res = CliRunner().invoke(cli, ["analyze", str(tmp_path / "rock_pores.nii.gz"), "--flow", "--flow-cube", "24",
                                   "--json"])
    assert res.exit_code == 0, res.output
    rec = json.loads(res.output)
    assert rec["flow_cube_voxels"] == 24 and rec["flow_cube_start_zyx"] == [12, 12, 12]
    assert rec["permeability_zyx_m2"][0] > 0 and rec["permeability_zyx_m2"][1:] == [None, None]
    assert rec["permeability_zyx_darcy"][0] == pytest.approx(rec["permeability_zyx_m2"][0] / DARCY_M2)
    assert rec["tortuosity_zyx"][0] == pytest.approx(1.0, abs=0.01)
    registered = {m.key for m in METRICS}
    assert {"permeability_zyx_m2", "permeability_zyx_darcy", "tortuosity_zyx", "flow_cube_voxels"} <= registered
    assert json.loads((tmp_path / "rock_analysis.json").read_text())["flow_cube_voxels"] == 24


def test_without_flow_or_units_the_keys_say_so(tmp_path):
    _needs_extra()
    from ctpore.pipelines.analysis_run import analyze

    pores = np.zeros((32, 32, 32), np.uint8)
    pores[:, 12:20, 12:20] = 1
    _write(tmp_path / "a_pores.nii.gz", pores, units=False)
    rec = analyze(tmp_path / "a_pores.nii.gz", flow_cube=32)
    assert rec["permeability_zyx_voxel2"][0] > 0 and "permeability_zyx_darcy" not in rec
    assert "permeability_zyx_m2" not in rec
    plain = analyze(tmp_path / "a_pores.nii.gz", outdir=tmp_path / "plain")
    assert not any(k.startswith(("permeability", "tortuosity", "flow_")) for k in plain)


def test_a_cube_too_large_is_refused_in_one_line_and_nothing_is_written(tmp_path):
    from ctpore.app.cli import main

    _write(tmp_path / "b_pores.nii.gz", np.ones((20, 20, 20), np.uint8))
    with pytest.raises(SystemExit) as exc:
        main(["analyze", str(tmp_path / "b_pores.nii.gz"), "--flow", "--flow-cube", str(MAX_CUBE + 100)])
    assert exc.value.code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b_pores.nii.gz"]


def test_the_flows_memory_estimate_covers_every_peak_the_bench_measured():
    """The estimate that bounds the flow by --memory-gb is at or above each peak ``ctpore bench flow``
    measured (docs/flow.json: each case a process of its own), and within 60% of the largest."""
    from ctpore.pipelines.flow import flow_gib

    bench = json.loads((Path(__file__).resolve().parents[1] / "docs" / "flow.json").read_text())
    cases = [c for c in bench["cases"] if c.get("peak_gb")]
    assert cases
    side = {c["name"]: min(bench["cube"], *c["shape"]) for c in cases}  # the cube each ran on
    for c in cases:
        assert flow_gib(side[c["name"]]) >= c["peak_gb"], c["name"]
    top = max(cases, key=lambda c: c["peak_gb"])
    assert flow_gib(side[top["name"]]) <= 1.6 * top["peak_gb"]


def test_the_cube_fits_the_memory_budget_or_is_refused():
    from ctpore.pipelines.flow import DEFAULT_CUBE, flow_gib, flow_side

    assert flow_side(None) == DEFAULT_CUBE and flow_side(None, 300) == 300  # no budget: as asked
    for gb in (1.0, 1.5, 3.0):
        n = flow_side(gb)  # the default shrinks to the largest cube that fits
        assert MIN_CUBE <= n < DEFAULT_CUBE and flow_gib(n) <= gb < flow_gib(n + 1)
        assert flow_side(gb, n) == n
        with pytest.raises(InputError, match=rf"--flow-cube {n + 1} needs about .* give --flow-cube {n} or less"):
            flow_side(gb, n + 1)
    assert flow_side(64.0) == DEFAULT_CUBE
    with pytest.raises(InputError, match="no room for the flow"):
        flow_side(0.45)


def test_a_cube_beyond_the_memory_budget_is_refused_before_any_work(tmp_path):
    from ctpore.app.cli import main

    _write(tmp_path / "b_pores.nii.gz", np.ones((20, 20, 20), np.uint8))
    with pytest.raises(SystemExit) as exc:
        main(["analyze", str(tmp_path / "b_pores.nii.gz"), "--flow", "--flow-cube", "300", "--memory-gb", "2"])
    assert exc.value.code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b_pores.nii.gz"]


def _scan(path, shape, spacing=(0.01, 0.01, 0.01), seed=2800125):
    from ctpore.data.synthetic import make_pair

    scan, _label, _ = make_pair(seed, shape=shape, family="tubes")
    _write(path, scan.astype(np.float32), spacing)


def test_reconstruct_with_flow_writes_the_flow_beside_the_analysis(tmp_path):
    _needs_extra()
    from ctpore.pipelines.reconstruct import reconstruct_file

    _scan(tmp_path / "s.nii.gz", (20, 36, 36))
    out = reconstruct_file(tmp_path / "s.nii.gz", tmp_path / "out", "otsu", flow=True, sample="all")
    m = out["result"]
    rec = json.loads((tmp_path / "out" / "s_analysis.json").read_text())
    assert m["flow_cube_voxels"] == 20 == rec["flow_cube_voxels"]  # the scan's thinnest side, under 200
    for key in ("permeability_zyx_m2", "permeability_zyx_darcy", "tortuosity_zyx"):
        assert m[key] == rec[key] and len(m[key]) == 3, key
    assert m["thickness_d50_mm"] is not None  # --flow implies --analyze


def test_reconstruct_with_flow_refuses_what_the_flow_cannot_do_before_the_model_runs(tmp_path):
    from ctpore.app.cli import main

    _scan(tmp_path / "s.nii.gz", (20, 36, 36), spacing=(0.02, 0.01, 0.01))
    with pytest.raises(SystemExit) as exc:
        main(["reconstruct", str(tmp_path / "s.nii.gz"), "-o", str(tmp_path / "out"), "--method", "otsu", "--flow"])
    assert exc.value.code == 2
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_sample_too_thin_for_a_cube_keeps_its_reconstruction_and_says_why(tmp_path):
    _needs_extra()
    from ctpore.errors import CtporeWarning
    from ctpore.pipelines.reconstruct import reconstruct_file

    _scan(tmp_path / "s.nii.gz", (12, 36, 36))  # 12 slices: no cube of 16 fits
    with pytest.warns(CtporeWarning, match="no permeability or tortuosity: no cube of 16"):
        out = reconstruct_file(tmp_path / "s.nii.gz", tmp_path / "out", "otsu", flow=True, sample="all")
    m = out["result"]
    assert m["permeability_zyx_m2"] is None and m["flow_cube_voxels"] is None
    assert out["pores"].exists() and m["thickness_d50_mm"] is not None


def test_where_pyamg_gives_up_the_tortuosity_is_solved_by_conjugate_gradients(monkeypatch):
    _needs_extra()
    import porespy as ps

    from ctpore.pipelines.flow import flow_figures

    real = ps.simulations.tortuosity_fd
    calls = []

    def stalls(im, axis, solver=None, **kw):  # PoreSpy's default solver failing as it did on vesicles
        calls.append(type(solver).__name__)
        if solver is None:
            raise Exception("Solver failed to converge, exit code: 100")
        return real(im, axis, solver=solver, **kw)

    monkeypatch.setattr(ps.simulations, "tortuosity_fd", stalls)
    f = flow_figures(_tubes(32, [(16, 16)], 5.0), 0.01)
    assert calls == ["NoneType", "ScipyCG"]
    assert f["tortuosity_zyx"][0] == pytest.approx(1.0, abs=0.01)
