"""An observation file checked against a state and turned into the analysis' observations and H.

:func:`load_for_state` is the one place this happens: the analysis calls it, and ``enkflow run``
calls it for every cycle's file before the first forecast. The configured observation operator
(:mod:`enkflow.obs.registry`) reads the file's location variables and locates the observations;
the rest (kinds, time window, localization half-widths, QC thresholds, vertical coordinate) is
the same for every operator.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from enkflow.analysis import taper
from enkflow.analysis.obsset import ObsSet
from enkflow.config import LocalizationConfig, Metric
from enkflow.errors import ConfigError
from enkflow.obs.fileformat import LEVEL, TIME, ObsFile
from enkflow.obs.kinds import KindTable, kind_table
from enkflow.obs.locating import Location, Target
from enkflow.obs.reader import ObsPart, Source, first
from enkflow.obs.registry import get_operator
from enkflow.obs.settings import ObsSettings
from enkflow.obs.vertical import row_vertical
from enkflow.state import StateLayout


def _check_time(of: ObsFile, window: tuple[float, float] | None, src: Source) -> None:
    if of.time is None or window is None:
        return
    lo, hi = window
    bad = (of.time < lo) | (of.time > hi)
    if bad.any():
        i = first(bad)
        raise src.fail(TIME, f"observation {src.at(i)} at time {float(of.time[i])!r} is outside the window [{lo:g}, {hi:g}] "
                             "(relative to the analysis time, model time unit; observations.window)")


def _for_radii(loc: LocalizationConfig | None) -> LocalizationConfig:
    """The localization kinds' own radii need (ConfigError where the analysis has none)."""
    if loc is None:
        raise ConfigError("an observation kind has a localization radius, but the analysis has no "
                          "[analysis.localization]", key="observations.kinds")
    return loc


def _half_width(kinds: KindTable, loc: LocalizationConfig | None) -> np.ndarray | None:
    """(n_obs,) localization half-widths where a kind has its own radius (the others: the
    localization's), in the metric's units; None where no kind has one."""
    if not np.isfinite(kinds.radius).any():
        return None
    loc = _for_radii(loc)
    r = np.where(np.isfinite(kinds.radius), kinds.radius, loc.radius)
    radii, which = np.unique(r, return_inverse=True)  # one call per distinct radius, not per observation
    return np.array([taper.half_width(float(v), loc.convention) for v in radii], dtype=np.float64)[which]


def _vertical(of: ObsFile, layout: StateLayout, loc: LocalizationConfig | None, at: Location,
              src: Source) -> np.ndarray | None:
    """The observations' vertical coordinate where vertical localization is configured: the file's
    ``level``, or (observations at state rows) the rows'; it must lie within the state's."""
    if loc is None or loc.vertical_radius is None or loc.vertical_coordinate is None:
        return of.obs.vcoord
    rz = row_vertical(layout, loc.vertical_coordinate)
    z = of.obs.vcoord
    if z is None:
        if at.site_rows is None:
            raise src.fail(LEVEL, "variable missing; vertical localization (analysis.localization.vertical_radius) "
                                  f"needs each observation's vertical coordinate ({loc.vertical_coordinate}) in "
                                  f"'{LEVEL}' where observations are located by their coordinates")
        return rz[at.site_rows]
    if z.size:
        lo, hi = float(rz.min()), float(rz.max())
        bad = (z < lo) | (z > hi)
        if bad.any():
            i = first(bad)
            raise src.fail(LEVEL, f"observation {src.at(i)} at level {float(z[i])!r} is outside the state's vertical "
                                  f"coordinate {loc.vertical_coordinate} range [{lo:g}, {hi:g}]")
    return z


def load_for_state(path: str | Path, layout: StateLayout, metric: Metric | None, *,
                   cycle: int | None = None, settings: ObsSettings | None = None,
                   part: ObsPart | None = None) -> ObsFile:
    """Read ``path`` (or the observations ``part`` of it) and check it against the state ``layout``, the
    analysis ``metric`` and the observation ``settings`` (interpolation, kinds, window; default:
    ``index``, no kinds, no window).

    Every check of an observation file that needs no forecast: the file's own
    (:func:`~enkflow.obs.reader.read_obs_file`: NaN/Inf, ``error_std <= 0``, ``state_index`` outside
    the state's rows, lon/lat ranges), the metric against the coordinates the state has, the
    kinds against ``[observations.kinds]``, the times against the window, and the observations'
    locations (inside the domain). The analysis and ``enkflow run``'s pre-flight check both call it.

    Parameters
    ----------
    layout : StateLayout
        The state the observations observe (from the template restart).
    metric : Metric or None
        The localization metric (``None``: a global analysis, no distances).
    cycle : int, optional
        The cycle the file serves; named in every error.
    settings : ObsSettings, optional
    part : ObsPart, optional
        Only these observations are read, checked and located (None: all); every check is per
        observation, so a part gives the rows of the whole file's result, and errors name the
        observation by its index in the file.

    Returns
    -------
    ObsFile
        A part's arrays are the rows of the whole file's, but for two that are None where no observation
        has a kind of its own radius (``.obs.half_width``) or gross-error threshold (``.qc_sigma``):
        a part without such observations has None where the whole has an array (fill them with
        :func:`with_kind_arrays`), and its ``.kind_names`` lack the configured names of kinds it does
        not hold (the union over the parts is the whole's).
        ``.obs``: values, error variances (times the kinds' ``error_factor**2``), kinds, localization
        coordinates (n_obs, n_dim) in the metric's units (n_obs: the part's size) - ``index``: the
        observed state rows' (``layout.coords[state_index]``); ``nearest``/``bilinear``: the file's own - and per-kind
        half-widths; ``.state_index`` (``index``/``nearest``); ``.operator`` (``bilinear``);
        ``.qc_sigma``; ``.time``; ``.attrs``.

    Raises
    ------
    FileFormatError
        Naming the observation file (or, for the state's coordinates, the template
        restart), the variable, the cycle and the first bad index (in the file).
    ConfigError
        Key ``analysis.localization.metric``: the sphere metric with a state whose
        coordinates are not longitude/latitude; ``observations.kinds...``: a kind's variable;
        ``observations.interpolation``: an operator that read other observations than ``part``.
    """
    settings = settings or ObsSettings()
    cfg = settings.config
    if metric is Metric.SPHERE and layout.coord_kind != "lonlat":
        raise ConfigError(
            f"the sphere metric needs longitude/latitude coordinates; the state of {layout.template} has "
            f"{', '.join(layout.coord_names)} (set state.coordinates, or use metric 'cartesian')",
            key="analysis.localization.metric",
        )
    src = Source(path, cycle, part)
    operator = get_operator(cfg.interpolation)
    of = operator.read(src, layout, metric)
    if part is not None and of.n_obs != part.size:
        raise ConfigError(f"observation operator '{operator.name}' read {of.n_obs} observations of {path}, but "
                          f"observations [{part.start}, {part.stop}) were asked for: its read must pass "
                          "part=source.part to read_obs_file", key="observations.interpolation")
    kinds = kind_table(of, cfg, src)
    _check_time(of, settings.window, src)
    period = settings.localization.period if settings.localization is not None else None
    at = operator.locate(of, Target(layout, metric, period, src, kinds.variable, kinds.names, frozenset(cfg.kinds)))
    half_width = _half_width(kinds, settings.localization)
    qc_sigma = None
    if np.isfinite(kinds.qc_sigma).any():
        qc_sigma = np.where(np.isfinite(kinds.qc_sigma), kinds.qc_sigma, np.inf)
    vcoord = _vertical(of, layout, settings.localization, at, src)
    obs = ObsSet(of.obs.values, of.obs.error_var * kinds.factor**2, at.coords, of.obs.kinds, half_width, vcoord)
    return ObsFile(obs, at.state_index, of.attrs, of.time, kinds.names, at.operator, qc_sigma, at.lonlat)


def with_kind_arrays(of: ObsFile, settings: ObsSettings, *, half_width: bool, qc_sigma: bool) -> ObsFile:
    """``of``, a part of a file (:func:`load_for_state`), with the per-observation arrays the whole file
    has because other parts' observations need them: ``half_width`` (True where any observation of the
    file has a kind of its own radius): the localization's half-width for each observation of ``of``
    without one; ``qc_sigma`` (True where any has a gross-error threshold): inf for each without one.
    Arrays ``of`` has already are kept."""
    hw, qc = of.obs.half_width, of.qc_sigma
    if half_width and hw is None:
        loc = _for_radii(settings.localization)
        hw = np.full(of.n_obs, taper.half_width(float(loc.radius), loc.convention))
    if qc_sigma and qc is None:
        qc = np.full(of.n_obs, np.inf)
    return dataclasses.replace(of, obs=dataclasses.replace(of.obs, half_width=hw), qc_sigma=qc)
