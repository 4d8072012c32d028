"""The observation layouts of ``enkflow bench land`` (``[analysis] observations``, issue 23)
compared in one invocation.

The analysis updates the member files in place, so a layout analyses a copy of the members
(:func:`scratch_copy`): both start from the same forecast, one after the other (their memory is
never held at once); :func:`same_analysis` checks that their analyses are equal bit for bit and
:func:`compare_layouts` merges their reports.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np

from enkflow.config import ObsLayout

# Figures reported for each layout: the distributed run's under these names, the replicated
# run's under NAME_replicated. Bytes and RSS of the largest rank; rank_* one entry per rank.
PER_LAYOUT = ("analysis_s", "total_s", "obs_bytes_max", "hx_bytes_max", "peak_rss_mb", "rank_peak_rss_mb",
              "rank_obs_held", "rank_obs_owned", "rank_obs_bytes", "rank_hx_bytes", "rank_analysis_s", "rank_cpu_s",
              "rank_search_s", "rank_kernel_s", "rank_window_s", "cpu_s_total")
# Distributed / replicated, by the figure they divide.
# cpu_s_total: the local filter's CPU seconds summed over the ranks, the work whatever the ranks' share of
# the cores (with more ranks than cores, wall seconds also measure the scheduler).
RATIOS = {"obs_bytes_ratio": "obs_bytes_max", "hx_bytes_ratio": "hx_bytes_max", "analysis_s_ratio": "analysis_s",
          "cpu_s_ratio": "cpu_s_total"}
_RATIO_LABELS = {"obs_bytes_ratio": "obs space", "hx_bytes_ratio": "H(x) exchange", "analysis_s_ratio": "analysis time",
                 "cpu_s_ratio": "local filter CPU"}
# The files of the problem that the analysis only reads.
INPUTS = ("truth.nc", "obs.nc")


class LayoutRuns(str, Enum):
    """``enkflow bench land --layout``: the layouts of the observations the bench analyses with."""

    DISTRIBUTED = "distributed"
    REPLICATED = "replicated"
    BOTH = "both"

    @property
    def layouts(self) -> tuple[ObsLayout, ...]:
        """The layouts in the order they run: the replicated (the baseline) first."""
        if self is LayoutRuns.BOTH:
            return (ObsLayout.REPLICATED, ObsLayout.DISTRIBUTED)
        return (ObsLayout(self.value),)


def scratch_copy(d: Path, members: Sequence[Path], layout: ObsLayout) -> Path:
    """A new directory in ``d`` holding a copy of each of ``members`` (updated in place by the
    analysis with ``layout``) and links to the problem's :data:`INPUTS` in ``d``; the caller removes it."""
    scratch = Path(tempfile.mkdtemp(prefix=f"{layout.value}-", dir=d))
    for p in members:
        shutil.copyfile(p, scratch / p.name)
    for name in INPUTS:
        (scratch / name).symlink_to((d / name).resolve())
    return scratch


def same_variables(a: Path, b: Path) -> bool:
    """Whether the NetCDF files ``a`` and ``b`` hold the same variables with the same dtype, shape
    and bytes (attributes aside); one variable in memory at a time."""
    with netCDF4.Dataset(a) as da, netCDF4.Dataset(b) as db:
        if list(da.variables) != list(db.variables):
            return False
        for name, va in da.variables.items():
            vb = db.variables[name]
            va.set_auto_maskandscale(False)
            vb.set_auto_maskandscale(False)
            x, y = np.asarray(va[...]), np.asarray(vb[...])
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                return False
    return True


def _largest(per_rank: list[float] | None) -> float | None:
    return None if per_rank is None else max(per_rank)


def _figures(res: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`PER_LAYOUT` figures of one run's JSON report (None where the analysis reported none)."""
    cpu = res.get("rank_cpu_s")
    return {k: res.get(k) for k in PER_LAYOUT} | {"obs_bytes_max": _largest(res.get("rank_obs_bytes")),
                                                  "hx_bytes_max": _largest(res.get("rank_hx_bytes")),
                                                  "cpu_s_total": None if cpu is None else sum(cpu)}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def same_analysis(a: Path, b: Path, names: Sequence[str]) -> bool:
    """Whether the files ``names`` in the directories ``a`` and ``b`` are :func:`same_variables`."""
    return all(same_variables(a / n, b / n) for n in names)


def compare_layouts(reports: Mapping[ObsLayout, dict[str, Any]], identical: bool | None) -> dict[str, Any]:
    """One report of the runs ``reports`` (the JSON of each analysis, by its layout): the distributed
    run's keys where it ran (else the replicated run's) with its :data:`PER_LAYOUT` figures; the
    replicated run's as ``NAME_replicated`` (None where it did not run); the :data:`RATIOS`
    distributed / replicated (None unless both ran), ``identical`` (:func:`same_analysis` of the two
    runs' files, None unless both ran) and ``layouts`` (in the order they ran)."""
    dist, rep = reports.get(ObsLayout.DISTRIBUTED), reports.get(ObsLayout.REPLICATED)
    base = dist if dist is not None else rep
    if base is None:
        raise ValueError("compare_layouts needs the report of at least one layout")
    out = base | _figures(base) | {f"{k}_replicated": v for k, v in _figures(rep or {}).items()}
    both = dist is not None and rep is not None
    out |= {name: _ratio(out[k], out[f"{k}_replicated"]) if both else None for name, k in RATIOS.items()}
    return out | {"identical": identical, "layouts": [layout.value for layout in reports]}


def _mb(v: float | None) -> str:
    return "n/a" if v is None else f"{v / 2**20:.1f} MB"


def _cpu(v: float | None) -> str:
    return "" if v is None else f" (local filter CPU {v:.1f} s over the ranks)"


def _n(v: float | None) -> str:
    return "n/a" if v is None else f"{int(v)}"


def _rank_line(res: Mapping[str, Any], r: int, suffix: str) -> str:
    def at(k: str) -> float | None:
        values = res.get(k + suffix)
        return None if values is None else values[r]
    rss = at("rank_peak_rss_mb")
    return (f"held {_n(at('rank_obs_held'))}, owned {_n(at('rank_obs_owned'))}, "
            f"obs space {_mb(at('rank_obs_bytes'))}, H(x) exchange {_mb(at('rank_hx_bytes'))}, "
            f"peak RSS {'n/a' if rss is None else f'{rss:.0f} MB'}")


def layout_lines(res: Mapping[str, Any]) -> str:
    """The text report of :func:`compare_layouts`' result: the largest rank's figures per layout, the
    ratios, whether the analyses are identical, then every rank's line."""
    both = len(res["layouts"]) > 1
    lines = [f"  {res['n_obs']:.0f} observations ({res['obs_fraction']} per land point); layouts run: "
             f"{', '.join(res['layouts'])}"]
    for name, suffix in [(res["observations"], "")] + ([("replicated", "_replicated")] if both else []):
        lines.append(f"  {name}: largest rank's obs space {_mb(res[f'obs_bytes_max{suffix}'])}, H(x) exchange "
                     f"{_mb(res[f'hx_bytes_max{suffix}'])}, peak RSS {res[f'peak_rss_mb{suffix}']:.0f} MB; "
                     f"analysis {res[f'analysis_s{suffix}']:.2f} s{_cpu(res.get(f'cpu_s_total{suffix}'))}")
    if both:
        ratios = ", ".join(f"{label} {'n/a' if res[k] is None else f'{res[k]:.3f}'}"
                           for k, label in _RATIO_LABELS.items())
        lines.append(f"  distributed / replicated: {ratios}; analyses identical bit for bit: {res['identical']}")
    for r in range(res["ranks"]):
        lines.append(f"    rank {r}: {_rank_line(res, r, '')}")
        if both:
            lines.append(f"    rank {r}, replicated: {_rank_line(res, r, '_replicated')}")
    return "\n".join(lines)
