"""Per-cycle scores of an experiment from its cycle directories: RMSE against a truth, spread,
OmB/OmA per observation kind, QC counts and the adaptive inflation's mean factor."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from enkflow.obs.diagnostics import summary_by_kind
from enkflow.progress import progress
from enkflow.report.files import cycle_dirs, has_variable, mean_variables, read_float, state_variables

INFLATION_FILE = "inflation.nc"


@dataclass
class CycleScores:
    """The scores of one cycle (empty where its files are missing)."""

    cycle: int
    rmse: dict[str, float] = field(default_factory=dict)  # per state variable, against the truth
    spread: dict[str, float] = field(default_factory=dict)  # sqrt(mean variance) per state variable
    obs: dict[str, dict[str, float]] = field(default_factory=dict)  # summary_by_kind
    qc: dict[str, int] = field(default_factory=dict)  # gross, buddy
    inflation_mean: float | None = None


def collect_scores(expdir: Path, truth: str | None = None) -> list[CycleScores]:
    """Scores of every cycle directory; ``truth`` a path template with ``{cycle}`` of truth files
    holding the state variables under the same names (the demo's ``truth/truth_{cycle:04d}.nc``)."""
    names = state_variables(expdir)
    out = []
    for k, cdir in progress(cycle_dirs(expdir), desc="report: reading cycles"):
        s = CycleScores(k)
        mean_f, spread_f, diag_f = cdir.mean, cdir.spread, cdir.obs_diag
        if spread_f.is_file():
            for n in mean_variables(spread_f, names):
                sp = read_float(spread_f, n)
                s.spread[n] = float(np.sqrt(np.nanmean(sp**2)))
        if truth and mean_f.is_file():
            tpath = Path(truth.format(cycle=k))
            if tpath.is_file():
                for n in mean_variables(mean_f, names):
                    m, t = read_float(mean_f, n), read_float(tpath, n) if has_variable(tpath, n) else None
                    if t is not None and t.size == m.size:
                        d = (m.reshape(-1) - t.reshape(-1))
                        s.rmse[n] = float(np.sqrt(np.nanmean(d**2)))
        if diag_f.is_file():
            s.obs = summary_by_kind(diag_f)
            q = read_float(diag_f, "qc")
            s.qc = {"gross": int(np.sum(q == 1)), "buddy": int(np.sum(q == 2)), "used": int(np.sum(q == 0))}
        if (cdir.path / INFLATION_FILE).is_file():
            s.inflation_mean = float(np.mean(read_float(cdir.path / INFLATION_FILE, "inflation")))
        out.append(s)
    return out
