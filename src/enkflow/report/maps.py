"""Maps of a cycle's analysis mean, increment (observation locations marked), spread and analysis minus
truth for the report page, in the state's own coordinates (:mod:`enkflow.report.map_grid`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.experiment.directory import CycleDir
from enkflow.obs.diagnostics import QC_USED
from enkflow.report.figures import fig_map
from enkflow.report.files import cycle_dirs, has_variable, mean_variables, read_float, state_variables
from enkflow.report.map_grid import MapGrid, map_grid

Figure = tuple[str, str, bytes]  # (id, title, PNG bytes)


class MapCycles(Enum):
    """Which cycles the page maps, besides one named cycle: the last one, or every one."""

    LAST = "last"
    ALL = "all"


@dataclass
class Maps:
    """The map figures, and one line per map the files could not give (why)."""

    figures: list[Figure] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MapSource:
    """What one variable's maps of one cycle are drawn from: the cycle's directory, the truth file (or None),
    the run's ``[state] coordinates``, and the id suffix (empty for a single mapped cycle)."""

    cycle: int
    cdir: CycleDir
    truth: Path | None
    coordinates: list[str] | None
    suffix: str


def _units(path: Path, name: str) -> str:
    with netCDF4.Dataset(path) as ds:
        return str(getattr(ds.variables[name], "units", ""))


def _fit(values: np.ndarray | None, mean: np.ndarray) -> np.ndarray | None:
    """``values`` in the shape of ``mean``: the same number of values, or one per valid (finite) point."""
    if values is None:
        return None
    if values.size == mean.size:
        return values.reshape(mean.shape)
    valid = np.isfinite(mean)
    if values.size == int(valid.sum()):
        full = np.full(mean.shape, np.nan)
        full[valid] = values.reshape(-1)
        return full
    return None


def _read(path: Path, name: str) -> np.ndarray | None:
    return read_float(path, name) if path.is_file() and has_variable(path, name) else None


def _observations(diag: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """The first two coordinates (the state's horizontal, then vertical one) of the used observations."""
    if not diag.is_file():
        return None
    with netCDF4.Dataset(diag) as ds:
        names = str(getattr(ds.variables["obs_value"], "coordinates", "")).split()
        if len(names) < 2:
            return None
        used = np.asarray(ds.variables["qc"][:]) == QC_USED
        return np.asarray(ds.variables[names[0]][:], float)[used], np.asarray(ds.variables[names[1]][:], float)[used]


def _increment(src: MapSource, n: str, mean: np.ndarray) -> np.ndarray | None:
    """Analysis minus forecast mean: the ``[analysis_output]`` increment statistics file, else the analysis
    mean minus the forecast mean statistics file."""
    inc = _fit(_read(src.cdir.path / f"{n}_analysis_increment.nc", f"{n}_analysis_increment"), mean)
    if inc is not None:
        return inc
    fmean = _fit(_read(src.cdir.path / f"{n}_forecast_mean.nc", f"{n}_forecast_mean"), mean)
    return None if fmean is None else mean - fmean


def _variable_maps(src: MapSource, n: str, out: Maps) -> None:
    """The maps of variable ``n`` in one cycle, added to ``out``."""
    k, mean_f = src.cycle, src.cdir.mean
    mean = read_float(mean_f, n)
    grid: MapGrid | None = map_grid(mean_f, n, src.coordinates)
    units = _units(mean_f, n)
    if grid is None:
        out.missing.append(f"{n}: {mean_f} has no coordinates that fit the variable; maps over the point index")

    def add(what: str, title: str, values: np.ndarray, diverging: bool,
            obs: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        out.figures.append((f"map-{n}-{what}{src.suffix}", f"{n}: {title}, cycle {k}",
                            fig_map(values, grid, f"{n}: {title}, cycle {k}", diverging=diverging,
                                    units=f"{n} [{units}]" if units else n, obs=obs)))

    add("mean", "analysis mean", mean, False)
    inc = _increment(src, n, mean)
    if inc is None:
        out.missing.append(f"{n}, cycle {k}: no increment map (no forecast statistics: [analysis_output] "
                           "statistics = false?)")
    else:
        add("increment", "analysis increment (analysis - forecast mean)", inc, True, _observations(src.cdir.obs_diag))
    spread = _fit(_read(src.cdir.spread, n), mean)
    if spread is not None:
        add("spread", "analysis spread", spread, False)
    truth = _fit(_read(src.truth, n), mean) if src.truth is not None else None
    if truth is not None:
        add("minus-truth", "analysis mean - truth", mean - truth, True)
    elif src.truth is not None:
        out.missing.append(f"{n}, cycle {k}: no analysis-minus-truth map ({src.truth} has no {n} of the mean's size)")


def map_figures(expdir: Path, choice: int | MapCycles, scored: list[int], truth: dict[int, Path],
                coordinates: list[str] | None) -> Maps:
    """The maps of every state variable for ``choice`` (a cycle number, the last cycle or all cycles) among the
    ``scored`` cycles (the initial ensemble's directory excepted); ``truth``: the truth file of each cycle
    that has one."""
    cycles = [(k, d) for k, d in cycle_dirs(expdir) if d.mean.is_file() and k in scored]
    out = Maps()
    if not cycles:
        out.missing.append("no analysis_mean.nc in the cycle directories ([analysis_output] mean_spread_files = "
                           "false?): no maps")
        return out
    if choice is MapCycles.ALL:
        chosen = cycles
    else:
        chosen = [cycles[-1]] if choice is MapCycles.LAST else [(k, d) for k, d in cycles if k == choice]
        if not chosen:
            out.missing.append(f"no maps of cycle {choice}: the cycles with an analysis mean are "
                               f"{', '.join(str(k) for k, _ in cycles)}")
    names = state_variables(expdir)
    for k, cdir in chosen:
        src = MapSource(k, cdir, truth.get(k), coordinates, f"-cycle-{k}" if choice is MapCycles.ALL else "")
        for n in mean_variables(cdir.mean, names):
            _variable_maps(src, n, out)
    return out
