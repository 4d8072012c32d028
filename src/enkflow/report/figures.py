"""The report page's figures as PNG bytes (matplotlib, Agg backend)."""

from __future__ import annotations

import io
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from enkflow.report.score_types import CycleScores, VariableScores
from enkflow.report.timing import Report

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _plt() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib  # lazy: 0.35 s or more with pyplot, and only the --html page draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: see matplotlib above

    return plt


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def fig_timing(rep: Report) -> bytes:
    fig, ax = _plt().subplots(figsize=(7, 3.2))
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
    return _png(fig)


def fig_scores(scores: list[CycleScores]) -> bytes:
    fig, (a1, a2) = _plt().subplots(1, 2, figsize=(9, 3.2))
    cyc = [s.cycle for s in scores]
    names = sorted({n for s in scores for n in s.variables})

    def var(s: CycleScores, n: str, key: str) -> float:
        x = getattr(s.variables.get(n, VariableScores()), key)
        return np.nan if x is None else x

    for n in names:
        if any(var(s, n, "rmse_analysis") == var(s, n, "rmse_analysis") for s in scores):
            a1.plot(cyc, [var(s, n, "rmse_analysis") for s in scores], "o-", label=f"{n} RMSE vs truth")
        a1.plot(cyc, [var(s, n, "spread_analysis") for s in scores], "s--", label=f"{n} spread")
    a1.set_title("analysis RMSE and spread (state space)")
    a1.set_xlabel("cycle")
    if not names:
        a1.text(0.5, 0.5, "no analysis mean/spread files", ha="center", transform=a1.transAxes)
    a1.legend(fontsize=8)
    kinds = sorted({k for s in scores for k in s.kinds})
    for key, style, label in (("omb_rms", "o-", "OmB RMS"), ("oma_rms", "s-", "OmA RMS")):
        for k in kinds:
            a2.plot(cyc, [_kind(s, k, key) for s in scores], style, label=f"{k} {label}")
    a2.set_title("observation space (used observations)")
    a2.set_xlabel("cycle")
    a2.legend(fontsize=8)
    for a in (a1, a2):
        a.set_xticks(cyc)
    return _png(fig)


def _kind(s: CycleScores, kind: str, key: str) -> float:
    k = s.kinds.get(kind)
    x = None if k is None else getattr(k, key)
    return np.nan if x is None else x


def fig_obs_by_kind(scores: list[CycleScores]) -> bytes:
    fig, (a1, a2) = _plt().subplots(1, 2, figsize=(9, 3.2))
    cyc = [s.cycle for s in scores]
    kinds = sorted({k for s in scores for k in s.kinds})
    for k in kinds:
        for key, style in (("omb", "o-"), ("oma", "s--")):
            a1.plot(cyc, [_kind(s, k, f"{key}_rms") for s in scores], style, label=f"{k} {key.upper()}")
            a2.plot(cyc, [_kind(s, k, f"{key}_bias") for s in scores], style, label=f"{k} {key.upper()}")
    a1.set_title("OmB / OmA RMS per kind")
    a2.set_title("OmB / OmA bias (mean) per kind")
    a2.axhline(0.0, color="0.6", lw=0.8)
    for a in (a1, a2):
        a.set_xlabel("cycle")
        a.set_xticks(cyc)
        a.legend(fontsize=7)
    return _png(fig)


def fig_qc(scores: list[CycleScores]) -> bytes:
    fig, ax = _plt().subplots(figsize=(7, 3.0))
    cyc = [s.cycle for s in scores]
    g = np.array([sum(k.n_gross for k in s.kinds.values()) for s in scores])
    b = np.array([sum(k.n_buddy for k in s.kinds.values()) for s in scores])
    u = np.array([sum(k.n_used for k in s.kinds.values()) for s in scores])
    ax.bar(cyc, g, label="rejected: gross error", color="tab:red")
    ax.bar(cyc, b, bottom=g, label="rejected: buddy check", color="tab:orange")
    for c, n_used, n_rej in zip(cyc, u, g + b):
        ax.annotate(f"{n_rej} of {n_used + n_rej}", (c, n_rej), ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, max(1, int((g + b).max(initial=0)) * 1.3))
    ax.set_xticks(cyc)
    ax.set_xlabel("cycle")
    ax.set_ylabel("observations")
    ax.set_title("quality control: rejected observations per cycle")
    ax.legend(fontsize=8)
    return _png(fig)


def fig_inflation(scores: list[CycleScores]) -> bytes:
    fig, ax = _plt().subplots(figsize=(6, 2.8))
    cyc = [s.cycle for s in scores]
    ax.plot(cyc, [s.inflation_mean if s.inflation_mean is not None else np.nan for s in scores], "o-")
    ax.set_xticks(cyc)
    ax.set_xlabel("cycle")
    ax.set_ylabel("mean covariance factor")
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.set_title("adaptive inflation (mean over state rows)")
    return _png(fig)

def fig_map(values: np.ndarray, where: tuple[np.ndarray, np.ndarray] | None, title: str, diverging: bool) -> bytes:
    fig, ax = _plt().subplots(figsize=(6, 3.6))
    v = np.asarray(values, float)
    cmap = "RdBu_r" if diverging else "viridis"
    ok = np.isfinite(v)
    vmax = float(np.nanmax(np.abs(v))) if diverging and ok.any() else None
    kw = dict(cmap=cmap, vmin=-vmax if vmax else None, vmax=vmax if vmax else None)
    if where is not None:
        lo, la = where
        sc = ax.scatter(lo[ok], la[ok], c=v[ok], s=8, **kw)
        ax.set_xlabel("longitude")
        ax.set_ylabel("latitude")
        ax.set_aspect("equal", adjustable="datalim")
    elif v.ndim == 2:
        sc = ax.imshow(v, origin="lower", **kw)
    else:
        sc = ax.scatter(np.arange(v.size)[ok.reshape(-1)], v.reshape(-1)[ok.reshape(-1)], c=v.reshape(-1)[ok.reshape(-1)],
                        s=6, **kw)
        ax.set_xlabel("point")
    fig.colorbar(sc, ax=ax, shrink=0.85)
    ax.set_title(title)
    return _png(fig)
