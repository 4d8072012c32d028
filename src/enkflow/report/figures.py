"""Drawing the report page's figures as PNG bytes (matplotlib, Agg backend): the one module that imports
matplotlib (:func:`pyplot`); the time bars and the maps here, the score figures in :mod:`.score_figures`."""

from __future__ import annotations

import io
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from enkflow.report.map_grid import MapGrid
from enkflow.report.timing import Report

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.cm import ScalarMappable
    from matplotlib.figure import Figure


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib  # lazy: 0.35 s or more with pyplot, and only the --html page draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: see matplotlib above

    return plt


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    pyplot().close(fig)
    return buf.getvalue()


def fig_timing(rep: Report) -> bytes:
    fig, ax = pyplot().subplots(figsize=(7, 3.2))
    cyc = [c.cycle for c in rep.cycles]
    if rep.mode == "online":
        parts = {"forecast phase (without transfers)": [max(0.0, c.forecast - c.transfer) for c in rep.cycles],
                 "transfers": [c.transfer for c in rep.cycles], "analysis": [c.analysis for c in rep.cycles],
                 "rest": [max(0.0, c.total - c.forecast - c.analysis) for c in rep.cycles]}
    else:
        parts = {"queuing": [c.queuing for c in rep.cycles],
                 "running (forecasts)": [max(0.0, c.running - c.analysis_compute) for c in rep.cycles],
                 "analysis": [min(c.analysis_compute, c.running) for c in rep.cycles],
                 "I/O": [c.io for c in rep.cycles], "overhead": [c.overhead for c in rep.cycles]}
    bottom = np.zeros(len(cyc))
    for label, v in parts.items():
        ax.bar(cyc, v, bottom=bottom, label=label)
        bottom += np.asarray(v)
    ax.set_xlabel("cycle")
    ax.set_ylabel("seconds")
    ax.set_title(f"time per cycle ({rep.mode})")
    ax.set_xticks(cyc)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return png_bytes(fig)


def _draw_values(ax: Axes, values: np.ndarray, grid: MapGrid | None, diverging: bool) -> ScalarMappable:
    """The values on ``ax`` where ``grid`` puts them (point index where it has none); the mappable."""
    v = np.asarray(values, float)
    ok = np.isfinite(v)
    vmax = float(np.nanmax(np.abs(v))) if diverging and ok.any() else None
    kw = {"cmap": "RdBu_r" if diverging else "viridis", "vmin": -vmax if vmax else None, "vmax": vmax}
    if grid is None:
        flat, okf = v.reshape(-1), ok.reshape(-1)
        ax.set_xlabel("point index (the file has no coordinates for this variable)")
        return ax.scatter(np.arange(flat.size)[okf], flat[okf], c=flat[okf], s=6, **kw)
    ax.set_xlabel(grid.x.label)
    ax.set_ylabel(grid.y.label)
    if grid.same_units:
        ax.set_aspect("equal", adjustable="box")
    if grid.gridded:
        return ax.pcolormesh(grid.x.values, grid.y.values, np.ma.masked_invalid(v.reshape(v.shape[-2:])),
                             shading="auto", **kw)
    x, y = grid.x.values.reshape(-1), grid.y.values.reshape(-1)
    okf = ok.reshape(-1)
    return ax.scatter(x[okf], y[okf], c=v.reshape(-1)[okf], s=8, **kw)


def fig_map(values: np.ndarray, grid: MapGrid | None, title: str, *, diverging: bool, units: str = "",
            obs: tuple[np.ndarray, np.ndarray] | None = None) -> bytes:
    """A map of ``values`` (NaN: no value) in the coordinates of ``grid``, in ``units``; ``obs``: the
    horizontal and vertical coordinates of the observations to mark on it."""
    fig, ax = pyplot().subplots(figsize=(6.4, 4.0))
    mappable = _draw_values(ax, values, grid, diverging)
    if obs is not None and grid is not None:
        ax.plot(obs[0], obs[1], "o", mfc="none", mec="k", ms=3, mew=0.5, label=f"observations used ({obs[0].size})")
        ax.legend(fontsize=7, loc="upper right")
    fig.colorbar(mappable, ax=ax, shrink=0.85, label=units)
    ax.set_title(title, fontsize=10)
    return png_bytes(fig)
