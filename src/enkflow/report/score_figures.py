"""The report page's score figures (PNG bytes) from the typed scores (:mod:`enkflow.report.score_types`):
the forecast/analysis RMSE sawtooth and spread, observation-space consistency, rank histograms, CRPS,
OmB/OmA per kind, quality control and adaptive inflation. Each takes what the page decided to show; a
missing score (None) is a gap in its line, never a zero."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from enkflow.report.figures import png_bytes, pyplot
from enkflow.report.score_types import CycleScores, ExperimentScores, KindScores, VariableScores

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def kind_label(kind: str) -> str:
    """A kind's name for a title: ``kind 3`` for a code without a name."""
    return f"kind {kind}" if kind.lstrip("-").isdigit() else kind


def _num(v: float | None) -> float:
    return np.nan if v is None else float(v)


def kinds_with(scores: ExperimentScores, has: Callable[[KindScores], bool]) -> list[str]:
    """The observation kinds (first-seen order) with a score ``has`` accepts in some cycle."""
    names = dict.fromkeys(k for c in scores.cycles for k, ks in c.kinds.items() if has(ks))
    return list(names)


def variables(scores: ExperimentScores) -> list[str]:
    """The state variables with scores, first-seen order."""
    return list(dict.fromkeys(n for c in scores.cycles for n in c.variables))


def _panels(n: int, width: float = 4.2, height: float = 3.0, rows: int = 1) -> tuple[Figure, np.ndarray]:
    """A figure of ``rows`` x ``n`` panels; the axes as a (rows, n) array."""
    fig, axes = pyplot().subplots(rows, n, figsize=(width * n + 0.8, height * rows), squeeze=False)
    return fig, axes


def _cycle_axis(ax: Axes, cycles: Sequence[int]) -> None:
    ax.set_xlabel("cycle")
    ax.set_xticks(list(cycles))


def _series(scores: ExperimentScores, kind: str, get: Callable[[KindScores], float | None]) -> list[float]:
    return [_num(get(c.kinds[kind])) if kind in c.kinds else np.nan for c in scores.cycles]


def _sawtooth(cycles: list[CycleScores], initial: VariableScores | None, forecast: Callable[[VariableScores], float | None],
              analysis: Callable[[VariableScores], float | None], name: str) -> tuple[list[float], list[float]]:
    """x and y of a forecast-then-analysis line: cycle 0's analysis (the initial ensemble), then per cycle k
    the forecast at k and the analysis at k (the drop at k is the analysis's gain)."""
    xs, ys = ([0.0], [_num(analysis(initial))]) if initial is not None else ([], [])
    for c in cycles:
        v = c.variables.get(name)
        xs += [float(c.cycle), float(c.cycle)]
        ys += [_num(forecast(v)) if v else np.nan, _num(analysis(v)) if v else np.nan]
    known = [(x, y) for x, y in zip(xs, ys) if np.isfinite(y)]  # a score not written joins its neighbours
    return [x for x, _ in known], [y for _, y in known]


def fig_rmse(scores: ExperimentScores) -> bytes:
    """Per state variable: forecast and analysis RMSE against the truth (a sawtooth over cycles, from cycle 0)
    and the spreads; the free run's RMSE where given. Without a truth: the spreads, and the title says so."""
    names = variables(scores)
    fig, axes = _panels(len(names), width=5.0, height=3.4)
    init_vars = scores.initial.variables if scores.initial is not None else {}
    for ax, n in zip(axes[0], names):
        init = init_vars.get(n)
        if scores.truth is not None:
            ax.plot(*_sawtooth(scores.cycles, init, lambda v: v.rmse_forecast, lambda v: v.rmse_analysis, n), "o-",
                    color="tab:red", ms=4, label="RMSE (forecast, then analysis)")
        ax.plot(*_sawtooth(scores.cycles, init, lambda v: v.spread_forecast, lambda v: v.spread_analysis, n), "s--",
                color="tab:blue", ms=3, label="spread (forecast, then analysis)")
        if any(c.variables.get(n) is not None and c.variables[n].rmse_free is not None for c in scores.cycles):
            ax.plot([c.cycle for c in scores.cycles],
                    [_num(c.variables[n].rmse_free) if n in c.variables else np.nan for c in scores.cycles],
                    ":", color="0.3", label="RMSE of the free run (no assimilation)")
        if init is not None:
            ax.axvline(0.0, color="0.8", lw=0.8)
        what = "RMSE against the truth and spread" if scores.truth is not None else \
            "spread only: no truth configured ([verification] truth or --truth)"
        ax.set_title(f"{n}: {what}", fontsize=9)
        _cycle_axis(ax, ([0] if init is not None else []) + [c.cycle for c in scores.cycles])
        ax.legend(fontsize=7)
    return png_bytes(fig)


def _total_spread(k: KindScores) -> float | None:
    """sqrt(prior spread^2 + sigma_o^2): what the OmB RMS of a consistent ensemble is."""
    if k.prior_spread_ms is None or k.sigma_o_ms is None:
        return None
    return float(np.sqrt(k.prior_spread_ms + k.sigma_o_ms))


def fig_consistency(scores: ExperimentScores, kinds: list[str]) -> bytes:
    """Per kind: OmB RMS against sqrt(prior spread^2 + mean sigma_o^2) (top) and their ratio (bottom; 1 for
    a consistent ensemble, above 1 under-dispersive)."""
    fig, axes = _panels(len(kinds), rows=2, height=2.8)
    cyc = [c.cycle for c in scores.cycles]
    for j, kind in enumerate(kinds):
        top, bottom = axes[0, j], axes[1, j]
        top.plot(cyc, _series(scores, kind, lambda k: k.omb_rms), "o-", label="OmB RMS")
        top.plot(cyc, _series(scores, kind, _total_spread), "s--", label="sqrt(prior spread² + σo²)")
        top.plot(cyc, _series(scores, kind, lambda k: None if k.prior_spread_ms is None else np.sqrt(k.prior_spread_ms)),
                 ":", color="0.5", label="prior spread of H(x)")
        top.set_title(f"{kind_label(kind)}: OmB RMS against the total spread", fontsize=9)
        top.legend(fontsize=7)
        bottom.plot(cyc, _series(scores, kind, lambda k: k.consistency), "o-", color="tab:purple")
        bottom.axhline(1.0, color="0.6", lw=0.8)
        bottom.set_ylabel("OmB RMS / total spread")
        bottom.set_title(f"{kind_label(kind)}: consistency ratio", fontsize=9)
        _cycle_axis(top, cyc)
        _cycle_axis(bottom, cyc)
    fig.tight_layout()
    return png_bytes(fig)


def pooled_rank_hist(scores: ExperimentScores, kind: str) -> np.ndarray:
    """The rank histogram of ``kind`` over all cycles, (N + 1,) int64."""
    hists = [c.kinds[kind].rank_hist for c in scores.cycles if kind in c.kinds and c.kinds[kind].rank_hist is not None]
    return np.sum(np.stack([np.asarray(h, np.int64) for h in hists]), axis=0)


def fig_rank_hist(scores: ExperimentScores, kinds: list[str]) -> bytes:
    """Per kind: the rank of each used observation in the prior ensemble perturbed with the observation error
    (Hamill 2001), all cycles pooled; flat for a reliable ensemble (the line: the count each rank expects)."""
    fig, axes = _panels(len(kinds))
    for ax, kind in zip(axes[0], kinds):
        h = pooled_rank_hist(scores, kind)
        ax.bar(np.arange(h.size), h, color="tab:green")
        ax.axhline(h.sum() / h.size, color="0.3", ls="--", lw=0.8, label="flat")
        ax.set_xlabel("rank of y among the N prior members")
        ax.set_ylabel("observations")
        ax.set_xticks(np.arange(h.size))
        ax.set_title(f"{kind_label(kind)}: rank histogram, {len(scores.cycles)} cycle(s) pooled", fontsize=9)
        ax.legend(fontsize=7)
    return png_bytes(fig)


@dataclass(frozen=True)
class Line:
    """One line of a per-kind panel: the score it draws, its matplotlib format and colour, and its label."""

    score: Callable[[KindScores], float | None]
    fmt: str
    label: str
    color: str | None = None


def _kind_lines(scores: ExperimentScores, kinds: list[str], lines: list[Line], ylabel: str, title: str,
                zero: bool = False) -> bytes:
    """One panel per kind, each with ``lines`` over the cycles (``zero``: a line at 0)."""
    fig, axes = _panels(len(kinds))
    cyc = [c.cycle for c in scores.cycles]
    for ax, kind in zip(axes[0], kinds):
        for line in lines:
            ax.plot(cyc, _series(scores, kind, line.score), line.fmt, color=line.color, label=line.label)
        if zero:
            ax.axhline(0.0, color="0.6", lw=0.8)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{kind_label(kind)}: {title}", fontsize=9)
        _cycle_axis(ax, cyc)
        ax.legend(fontsize=7)
    return png_bytes(fig)


def fig_crps(scores: ExperimentScores, kinds: list[str]) -> bytes:
    """Per kind: the mean ensemble CRPS of H(x) against y, prior and posterior, per cycle."""
    return _kind_lines(scores, kinds, [Line(lambda k: k.crps_prior, "o-", "prior (forecast)"),
                                       Line(lambda k: k.crps_posterior, "s--", "posterior (analysis)")],
                       "mean CRPS (observation units)", "CRPS")


def fig_obs_by_kind(scores: ExperimentScores, kinds: list[str]) -> bytes:
    """Per kind (one panel each): bias and RMS of OmB and OmA over the used observations."""
    return _kind_lines(scores, kinds, [Line(lambda k: k.omb_rms, "o-", "OmB RMS", "tab:red"),
                                       Line(lambda k: k.oma_rms, "s-", "OmA RMS", "tab:blue"),
                                       Line(lambda k: k.omb_bias, "o:", "OmB bias", "tab:red"),
                                       Line(lambda k: k.oma_bias, "s:", "OmA bias", "tab:blue")],
                       "observation units", "OmB / OmA", zero=True)


def fig_qc(scores: ExperimentScores) -> bytes:
    """Observations rejected per cycle by the gross-error and the buddy check, all kinds."""
    fig, ax = pyplot().subplots(figsize=(7, 3.0))
    cyc = [c.cycle for c in scores.cycles]
    g = np.array([sum(k.n_gross for k in c.kinds.values()) for c in scores.cycles])
    b = np.array([sum(k.n_buddy for k in c.kinds.values()) for c in scores.cycles])
    u = np.array([sum(k.n_used for k in c.kinds.values()) for c in scores.cycles])
    ax.bar(cyc, g, label="rejected: gross error", color="tab:red")
    ax.bar(cyc, b, bottom=g, label="rejected: buddy check", color="tab:orange")
    for c, n_used, n_rej in zip(cyc, u, g + b):
        ax.annotate(f"{n_rej} of {n_used + n_rej}", (c, n_rej), ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, max(1, int((g + b).max(initial=0)) * 1.3))
    _cycle_axis(ax, cyc)
    ax.set_ylabel("observations")
    ax.set_title("quality control: rejected observations per cycle")
    ax.legend(fontsize=8)
    return png_bytes(fig)


def fig_inflation(scores: ExperimentScores) -> bytes:
    """The adaptive inflation's mean covariance factor per cycle."""
    fig, ax = pyplot().subplots(figsize=(6, 2.8))
    cyc = [c.cycle for c in scores.cycles]
    ax.plot(cyc, [_num(c.inflation_mean) for c in scores.cycles], "o-")
    _cycle_axis(ax, cyc)
    ax.set_ylabel("mean covariance factor")
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.set_title("adaptive inflation (mean over state rows)")
    return png_bytes(fig)
