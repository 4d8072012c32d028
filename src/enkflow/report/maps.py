"""Maps of the last cycle's analysis mean, increment and spread for the report page."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from enkflow.experiment.directory import CycleDir
from enkflow.report.figures import fig_map
from enkflow.report.files import cycle_dirs, has_variable, lonlat, mean_variables, read_float, state_variables


def _increment(cdir: CycleDir, n: str, k: int, mean: np.ndarray,
               where: tuple[np.ndarray, np.ndarray] | None) -> list[tuple[str, str, bytes]]:
    """The map of variable ``n``'s analysis increment in cycle ``k`` (directory ``cdir``; ``mean``: its analysis
    mean, ``where``: the points' longitude and latitude): from the statistics files, else at the observations."""
    inc_f = cdir.path / f"{n}_analysis_increment.nc"
    if inc_f.is_file():
        inc = read_float(inc_f, f"{n}_analysis_increment").reshape(-1)
        full = np.full(mean.shape, np.nan)
        valid = np.isfinite(mean)
        if inc.size == mean.size:
            full = inc.reshape(mean.shape)
        elif inc.size == int(valid.sum()):
            full[valid] = inc
        else:
            return []
        return [(f"map-{n}-increment", f"{n}: analysis increment, cycle {k}",
                 fig_map(full, where, f"{n} increment (analysis - forecast mean), cycle {k}", True))]
    od = cdir.obs_diag
    if od.is_file() and has_variable(od, "lon"):
        # No forecast mean saved ([analysis_output] statistics = false): the increment at the observations.
        inc = read_float(od, "posterior_mean") - read_float(od, "prior_mean")
        return [(f"map-{n}-increment", f"analysis increment at the observations, cycle {k}",
                 fig_map(inc, (read_float(od, "lon"), read_float(od, "lat")),
                         f"increment of H(x) at the observations (posterior - prior mean), cycle {k}", True))]
    return []


def map_figures(expdir: Path) -> list[tuple[str, str, bytes]]:
    """``(id, title, png)`` of the last cycle's analysis mean, increment and spread per state variable."""
    cycles = [(k, d) for k, d in cycle_dirs(expdir) if d.mean.is_file()]
    if not cycles:
        return []
    k, cdir = cycles[-1]
    mean_f, spread_f = cdir.mean, cdir.spread
    out = []
    for n in mean_variables(mean_f, state_variables(expdir)):
        mean = read_float(mean_f, n)
        where = lonlat(mean_f, n)
        out.append((f"map-{n}-mean", f"{n}: analysis mean, cycle {k}", fig_map(mean, where, f"{n} analysis mean, cycle {k}", False)))
        out += _increment(cdir, n, k, mean, where)
        if spread_f.is_file():
            out.append((f"map-{n}-spread", f"{n}: analysis spread, cycle {k}",
                        fig_map(read_float(spread_f, n), where, f"{n} analysis spread, cycle {k}", False)))
    return out
