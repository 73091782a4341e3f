"""The napari pictures of docs/napari.md, made by the plugin itself: ``python -m ctpore.app.napari.screenshots docs``.

Needs a display (``xvfb-run -a python -m ...`` on a machine without one). Opens a simulated scan,
reconstructs its pores with the shipped weights through the Reconstruct widget, shows them in
3D over the scan, then picks a voxel in the Attention inspector; saves ``napari_pores_3d.png``
and ``napari_attention.png`` in the folder given.
"""

from __future__ import annotations

import sys
from pathlib import Path


def settle(app, seconds: float = 1.0) -> None:
    """Let Qt lay out and paint what just changed before a screenshot."""
    import time

    end = time.time() + seconds
    while time.time() < end:
        app.processEvents()
        time.sleep(0.02)


def main(outdir: str) -> None:
    import napari
    from qtpy.QtWidgets import QApplication

    from ctpore.app.napari.layers import simulated_layers
    from ctpore.app.napari.widgets import AttentionInspector, ReconstructWidget

    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    viewer = napari.Viewer(show=True)
    viewer.window.resize(1560, 960)
    for data, kwargs, kind in simulated_layers(seed=7, shape=(64, 128, 128)):
        if kind == "image":
            getattr(viewer, f"add_{kind}")(data, **kwargs)
    rec = ReconstructWidget(viewer)
    viewer.window.add_dock_widget(rec, name="Reconstruct pores (ctpore)")
    rec.run()
    app = QApplication.instance()
    while not rec.run_button.isEnabled():
        app.processEvents()
    viewer.dims.ndisplay = 3
    camera = viewer.scene.camera if hasattr(viewer, "scene") else viewer.camera  # napari 0.9 moved it
    camera.angles = (0, 30, 60)
    camera.zoom *= 0.9
    settle(app)
    viewer.screenshot(str(out / "napari_pores_3d.png"), canvas_only=False, flash=False)
    viewer.dims.ndisplay = 2
    viewer.window.remove_dock_widget(rec)
    insp = AttentionInspector(viewer)
    insp.setMinimumWidth(700)  # room for the heatmap at its size
    viewer.window.add_dock_widget(insp, name="Attention inspector (ctpore)")
    viewer.dims.set_point(0, viewer.layers[0].data_to_world((40, 64, 64))[0])
    insp.set_point((40, 64, 64))
    insp.show_heads()
    while insp.info is None:
        app.processEvents()
    settle(app)
    viewer.screenshot(str(out / "napari_attention.png"), canvas_only=False, flash=False)
    viewer.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs")
