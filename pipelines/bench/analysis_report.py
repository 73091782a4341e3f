"""The report of ``ctpore bench analysis`` (:mod:`ctpore.pipelines.bench.analysis`): ``analysis.json``
and ``analysis.md`` (pore sizes and the drainage curve beside PoreSpy, connectivity beside a
labelling, surface areas beside the analytic ones, whole processes timed), and the Leopard
sandstone's pore-size plot copied beside them.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_analysis_report"]


def write_analysis_report(res: dict, outdir: Path, command: str) -> tuple[Path, Path]:
    """``analysis.json`` and ``analysis.md`` in ``outdir``."""
    from ctpore.atomic import write_json_atomic, write_lines_atomic

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    res = {**res, "command": command}
    jpath = write_json_atomic(outdir / "analysis.json", res)
    picture = Path(res.get("workdir", "")) / "leopard_psd.png"
    if picture.is_file():
        import shutil

        shutil.copyfile(picture, outdir / "analysis_psd.png")

    def f(v, nd=4):
        return "-" if v is None else (f"{v:.{nd}g}" if isinstance(v, float) else str(v))

    lines = ["# ctpore analyze beside PoreSpy, scikit-image and the analytic truth", "",
             f"Written by `{command}` on {res['cpu']}"
             + (f" ({res['porespy_python']})" if res.get("porespy_python") else "") + ".", "",
             "## Pore sizes (local thickness, volume-weighted diameters)", "",
             "PoreSpy is 3.2's `local_thickness(method=\"dt\")`; the same d10/d50/d90 rule is applied to both maps "
             "(the smallest diameter with at least that share of the pore volume at or below it). A match is "
             "within one radius step (2 voxels of diameter) or 10%, whichever is larger.", "",
             "| volume | porosity | d10 ctpore / PoreSpy | d50 | d90 | maps equal (voxels) | match |",
             "|---|---:|---|---|---|---:|---|"]
    for c in res["cases"]:
        ps = c.get("porespy", {})
        cells = [f"{f(c['ctpore'][f'thickness_{q}'])} / {f(ps.get(f'thickness_{q}'))}" for q in ("d10", "d50", "d90")]
        eq = c.get("maps_equal_voxels")
        lines.append(f"| {c['name']} ({'x'.join(map(str, c['shape']))}, {c['spacing_mm'][0]:g} mm) | "
                     f"{c['porosity']:.3f} | " + " | ".join(cells) + f" | {'-' if eq is None else f'{eq:.2%}'} | "
                     f"{'yes' if c.get('quantiles_match') else 'no' if 'quantiles_match' in c else '-'} |")
    lines += ["", "The drainage curve from the top face (slice 0) against PoreSpy 3.2's "
              "`porosimetry(im, inlets=slice 0, method=\"dt\")`: the share of the pore volume invaded at every "
              "diameter.", "", "| volume | drainage d50 ctpore / PoreSpy | curves equal |", "|---|---|---|"]
    for c in res["cases"]:
        ps = c.get("porespy", {})
        eq = c.get("drainage_equal")
        lines.append(f"| {c['name']} | {f(c['ctpore'].get('drainage_d50'))} / {f(ps.get('drainage_d50'))} | "
                     f"{'-' if eq is None else 'yes' if eq else 'no'} |")
    if (outdir / "analysis_psd.png").is_file():
        lines += ["", "![The Leopard sandstone's pore-size distribution: the share of the pore volume per "
                  "local-thickness diameter, the cumulative curve, d10, d50 and d90, and the drainage curve from the "
                  "top face](analysis_psd.png)"]
    lines += ["", "## Connected and percolating porosity", "",
              "Every voxel is the sample; the reference labels the whole volume with scikit-image (26-connected).", "",
              "| volume | connected ctpore / labelling | percolating z, y, x (ctpore) | equal |", "|---|---|---|---|"]
    for c in res["cases"]:
        ct, ref = c["ctpore"], c["labelling"]
        lines.append(f"| {c['name']} | {ct['connected_porosity']:.4f} / {ref['connected_porosity']:.4f} | "
                     + ", ".join(f(v) for v in ct["percolating_porosity_zyx"])
                     + f" | {'yes' if c['connectivity_equal'] else 'no'} |")
    lines += ["", "## Surface area against the analytic area", "",
              "ctpore: the 13-direction Crofton estimate from 2x2x2 configurations (Ohser & Mücklich); marching "
              "cubes: scikit-image's mesh of the binary volume, for reference (balls only).", "",
              "| shape | analytic (voxel²) | ctpore | error | marching cubes | error |",
              "|---|---:|---:|---:|---:|---:|"]
    for s in res["surface"]:
        lines.append(f"| {s['shape']} | {s['analytic']:.1f} | {s['ctpore']:.1f} | {s['ctpore_error']:+.2%} | "
                     f"{f(s['marching_cubes'], 6)} | "
                     f"{'-' if s['marching_cubes_error'] is None else format(s['marching_cubes_error'], '+.2%')} |")
    lines += ["", "## Whole processes on simulated volumes", "",
              "ctpore: `ctpore analyze` (every figure and output, default memory budget of 1.5 GB); PoreSpy: "
              "loading the volume and `local_thickness` alone, not run above the largest size it is given. A "
              "simulated 256³ grain packing, tiled to the larger sizes. Peak: the child's peak resident set.", "",
              "| volume | ctpore seconds | ctpore peak GB | PoreSpy seconds | PoreSpy peak GB |",
              "|---|---:|---:|---:|---:|"]
    for s in res["scale"]:
        ps = s.get("porespy") or {}
        pst = ("did not finish" if ps.get("timed_out") else "not run" if ps.get("skipped")
               else f(ps.get("seconds")))
        lines.append(f"| {s['size']}³ | {f(s['ctpore']['seconds'])} | {f(s['ctpore']['peak_gb'])} | {pst} | "
                     f"{f(ps.get('peak_gb'))} |")
    mpath = outdir / "analysis.md"
    write_lines_atomic(mpath, lines)
    return jpath, mpath
