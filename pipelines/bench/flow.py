"""``ctpore bench flow``: the permeability and tortuosity of ``ctpore analyze --flow`` on an analytic
channel, the Leopard sandstone and a simulated volume of each pore family, each in a child process
of its own (its seconds and peak memory are its alone). Writes ``flow.md`` and ``flow.json``.

The analytic case is one straight round channel through a cube: Hagen-Poiseuille's permeability
(porosity x r² / 8, with r the radius of a disc of the channel's cross-section in voxels) and a
tortuosity of 1. The network's pyramids-and-cuboids conduits idealize a tube, so its permeability
is near that figure, not equal to it; the tortuosity is a diffusion on the voxels themselves.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from ctpore.data.splits import FURTHER_SEED_BASE
from ctpore.progress import ProgressFn

__all__ = ["FLOW_SEED_BASE", "bench_flow", "write_flow_report"]

#: The simulated volumes' seeds (the further held-out block, apart from the other benches').
FLOW_SEED_BASE = FURTHER_SEED_BASE + 950_000

_CHILD = """
import json, sys, time, numpy as np
from ctpore.pipelines.flow import flow_figures
im = np.load(sys.argv[1])
t0 = time.perf_counter()
f = flow_figures(im, float(sys.argv[2]))
f["seconds"] = round(time.perf_counter() - t0, 1)
print(json.dumps(f))
"""


def _channel(n: int = 48, r: float = 8.0) -> tuple[np.ndarray, float]:
    """One straight round channel along Z through a cube; (pores, Hagen-Poiseuille's k in voxels²)."""
    yy, xx = np.mgrid[:n, :n] + 0.5
    disc = (yy - n / 2) ** 2 + (xx - n / 2) ** 2 <= r * r
    radius = float(np.sqrt(disc.sum() / np.pi))
    return np.broadcast_to(disc, (n, n, n)).copy(), float(disc.mean()) * radius ** 2 / 8.0


def _run(name: str, pores: np.ndarray, voxel_mm: float, workdir: Path, limit_s: float) -> dict:
    from ctpore.pipelines.bench.analysis import run_child

    src = workdir / f"flow_{name}.npy"
    np.save(src, np.ascontiguousarray(pores, bool))
    run = run_child([sys.executable, "-c", _CHILD, str(src), repr(voxel_mm)], timeout=limit_s)
    row = {"name": name, "shape": list(pores.shape), "voxel_mm": voxel_mm, "porosity": float(pores.mean()),
           "peak_gb": run.get("peak_gb"), "seconds_process": run.get("seconds")}
    if run.get("rc") == 0:
        row.update(json.loads(run["out"]))
    else:
        row["error"] = run.get("err") or ("timed out" if run.get("timed_out") else "failed")
    return row


def bench_flow(cube: int = 200, sim_size: int = 128, workdir: Path = Path("runs/flow"), limit_s: float = 3600.0,
               progress: ProgressFn = None) -> dict:
    """Every case of the module docstring; returns the report's content."""
    from ctpore.data.synthetic import make_pair
    from ctpore.data.synthetic.structures import FAMILIES
    from ctpore.pipelines.bench.analysis import cpu_name
    from ctpore.pipelines.bench.quality import default_leopard
    from ctpore.pipelines.flow import choose_cube

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cases = []
    ch, poiseuille = _channel()
    row = _run("channel", ch, 0.01, workdir, limit_s)
    row["poiseuille_m2"] = poiseuille * (0.01e-3) ** 2
    cases.append(row)
    todo = [(fam, i) for i, fam in enumerate(FAMILIES)]
    leo = default_leopard()
    if leo is not None:
        from ctpore.data.io import read_volume

        vol, geom = read_volume(leo)
        (z0, y0, x0), n = choose_cube(vol.shape, None, cube)
        cases.append(_run("leopard", vol[z0:z0 + n, y0:y0 + n, x0:x0 + n] > 0, float(min(geom.spacing_mm)),
                          workdir, limit_s))
    for k, (fam, i) in enumerate(todo):
        if progress is not None:
            progress(k, len(todo), f"flow: {fam}")
        _s, pores, _m = make_pair(FLOW_SEED_BASE + i, shape=(min(sim_size, cube),) * 3, family=fam)
        cases.append(_run(fam, pores > 0, 0.01, workdir, limit_s))
    if progress is not None:
        progress(len(todo), len(todo), "flow")
    return {"cases": cases, "cube": cube, "sim_size": sim_size, "cpu": cpu_name()}


def write_flow_report(res: dict, outdir: Path, command: str) -> tuple[Path, Path]:
    """``flow.json`` and ``flow.md`` in ``outdir``."""
    from ctpore.atomic import write_json_atomic, write_lines_atomic

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    res = {**res, "command": command}
    jpath = write_json_atomic(outdir / "flow.json", res)

    def f(v: Optional[float], nd: int = 4) -> str:
        return "-" if v is None else f"{v:.{nd}g}"

    lines = ["# Permeability and tortuosity (`ctpore analyze --flow`)", "",
             f"Written by `{command}` on {res['cpu']}.", "",
             "Per axis (Z, Y, X) of each cube: the permeability from PoreSpy's `snow2` network and OpenPNM's "
             "Stokes flow (pyramids-and-cuboids conduits, as OpenPNM validates it against direct simulation), and "
             "PoreSpy's `tortuosity_fd`; 1 D = 9.869233e-13 m². `-`: no pore path crosses that axis. Seconds "
             "and peak memory are the whole child process's.", "",
             "| cube | porosity | permeability Z / Y / X (darcy) | tortuosity Z / Y / X | seconds | peak GB |",
             "|---|---:|---|---|---:|---:|"]
    for c in res["cases"]:
        if "error" in c:
            lines.append(f"| {c['name']} | {c['porosity']:.3f} | {c['error']} | | | |")
            continue
        size = f"{c['shape'][0]}³, {c['voxel_mm']:g} mm"
        lines.append(f"| {c['name']} ({size}) | {c['porosity']:.3f} | "
                     f"{' / '.join(f(v) for v in c['permeability_darcy_zyx'])} | "
                     f"{' / '.join(f(v) for v in c['tortuosity_zyx'])} | {f(c['seconds_process'])} | "
                     f"{f(c['peak_gb'], 3)} |")
    ch = next((c for c in res["cases"] if c["name"] == "channel" and "error" not in c), None)
    if ch is not None and ch["permeability_zyx"][0]:
        lines += ["", f"The straight round channel: the network gives {f(ch['permeability_zyx'][0])} m² along it, "
                  f"Hagen-Poiseuille {f(ch['poiseuille_m2'])} m² (ratio "
                  f"{ch['permeability_zyx'][0] / ch['poiseuille_m2']:.2f}; the network idealizes a tube as "
                  f"pyramids and cuboids); its tortuosity is {f(ch['tortuosity_zyx'][0])} (a straight path: 1)."]
    mpath = outdir / "flow.md"
    write_lines_atomic(mpath, lines)
    return jpath, mpath
