"""A toy metric, added the documented way: one function, one registration line.

``first_slice_porosity``: the pore fraction of the first slice.
"""

from __future__ import annotations

import numpy as np

from ctpore.data.metrics import Metric, register_metric


def _first_slice(acc, slab, state):
    if slab.start == 0:
        state["value"] = float(np.count_nonzero(slab.pores[0]) / slab.pores[0].size)


register_metric(Metric("first_slice_porosity", lambda acc: acc.state("first_slice_porosity")["value"],
                       add=_first_slice, summary=True))  # summary: a column of ctpore batch's summary
