"""``enkflow report DIR --html``: one self-contained HTML page of an experiment, figures embedded.

What a data-assimilation scientist looks at first, from what the experiment directory holds:

- per-cycle time bars (offline: queuing, forecasts, analysis, I/O, overhead, from
  :func:`enkflow.report.load_report`; online: forecast phase, transfers, analysis, rest);
- RMSE (against a truth, when a truth file template is given) and spread of the analysis over
  cycles (``cycles/NNNN/analysis_{mean,spread}.nc``), and OmB/OmA RMS in observation space;
- OmB/OmA bias and RMS per observation kind over cycles (``cycles/NNNN/obs_diag.nc``,
  :mod:`enkflow.obs.diagnostics`);
- QC counts per cycle (rejected by the gross-error and by the buddy check);
- the adaptive inflation's mean factor over cycles, where ``inflation.nc`` files exist;
- maps of the last cycle's analysis mean, increment and spread (a lon-lat scatter of the
  points, or an image for a 2-D grid; the increment from the ``[analysis_output]`` statistics
  files ``VAR_analysis_increment.nc``).

Figures are PNG (matplotlib, Agg backend) embedded as base64, so the page is one file.
"""

from __future__ import annotations

import base64
import html
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from enkflow.errors import EnkflowError
from enkflow.obs.diagnostics import FILE_NAME as OBS_DIAG
from enkflow.obs.diagnostics import summary_by_kind
from enkflow.progress import progress
from enkflow.report.timing import Report, load_report, render_report

INFLATION_FILE = "inflation.nc"


@dataclass
class CycleScores:
    cycle: int
    rmse: dict[str, float] = field(default_factory=dict)  # per state variable, against the truth
    spread: dict[str, float] = field(default_factory=dict)  # sqrt(mean variance) per state variable
    obs: dict[str, dict[str, float]] = field(default_factory=dict)  # summary_by_kind
    qc: dict[str, int] = field(default_factory=dict)  # gross, buddy
    inflation_mean: float | None = None


def _cycle_dirs(expdir: Path) -> list[tuple[int, Path]]:
    out = []
    for p in sorted((expdir / "cycles").glob("[0-9]*")):
        if p.is_dir() and p.name.isdigit():
            out.append((int(p.name), p))
    return out


def _state_variables(expdir: Path) -> list[str] | None:
    try:
        cfg = json.loads((expdir / "config.json").read_text())
        return list((cfg.get("state") or {}).get("variables") or []) or None
    except (OSError, ValueError):
        return None


def _mean_vars(path: Path, names: list[str] | None) -> list[str]:
    """The state variables of a mean/spread file: ``names`` where given, else those with a ``member:`` cell method."""
    import netCDF4

    with netCDF4.Dataset(path) as ds:
        if names:
            return [n for n in names if n in ds.variables]
        return [n for n, v in ds.variables.items() if str(getattr(v, "cell_methods", "")).startswith("member:")]


def _read(path: Path, name: str) -> np.ndarray:
    """A variable as float64 with fill values as NaN."""
    import netCDF4

    with netCDF4.Dataset(path) as ds:
        v = ds.variables[name]
        v.set_auto_maskandscale(True)
        a = v[...]
        return np.ma.filled(np.ma.asarray(a, dtype=np.float64), np.nan)


def collect_scores(expdir: Path, truth: str | None = None) -> list[CycleScores]:
    """Scores of every cycle directory; ``truth`` a path template with ``{cycle}`` of truth files
    holding the state variables under the same names (the demo's ``truth/truth_{cycle:04d}.nc``)."""
    names = _state_variables(expdir)
    out = []
    for k, cdir in progress(_cycle_dirs(expdir), desc="report: reading cycles"):
        s = CycleScores(k)
        mean_f, spread_f = cdir / "analysis_mean.nc", cdir / "analysis_spread.nc"
        if spread_f.is_file():
            for n in _mean_vars(spread_f, names):
                sp = _read(spread_f, n)
                s.spread[n] = float(np.sqrt(np.nanmean(sp**2)))
        if truth and mean_f.is_file():
            tpath = Path(truth.format(cycle=k))
            if tpath.is_file():
                for n in _mean_vars(mean_f, names):
                    m, t = _read(mean_f, n), _read(tpath, n) if _has(tpath, n) else None
                    if t is not None and t.size == m.size:
                        d = (m.reshape(-1) - t.reshape(-1))
                        s.rmse[n] = float(np.sqrt(np.nanmean(d**2)))
        if (cdir / OBS_DIAG).is_file():
            s.obs = summary_by_kind(cdir / OBS_DIAG)
            q = _read(cdir / OBS_DIAG, "qc")
            s.qc = {"gross": int(np.sum(q == 1)), "buddy": int(np.sum(q == 2)), "used": int(np.sum(q == 0))}
        if (cdir / INFLATION_FILE).is_file():
            s.inflation_mean = float(np.mean(_read(cdir / INFLATION_FILE, "inflation")))
        out.append(s)
    return out


def _has(path: Path, name: str) -> bool:
    import netCDF4

    with netCDF4.Dataset(path) as ds:
        return name in ds.variables


# -- figures --------------------------------------------------------------------------------

def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def fig_timing(rep: Report) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.2))
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
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.2))
    cyc = [s.cycle for s in scores]
    names = sorted({n for s in scores for n in (*s.rmse, *s.spread)})
    for n in names:
        if any(n in s.rmse for s in scores):
            a1.plot(cyc, [s.rmse.get(n, np.nan) for s in scores], "o-", label=f"{n} RMSE vs truth")
        a1.plot(cyc, [s.spread.get(n, np.nan) for s in scores], "s--", label=f"{n} spread")
    a1.set_title("analysis RMSE and spread (state space)")
    a1.set_xlabel("cycle")
    if not names:
        a1.text(0.5, 0.5, "no analysis mean/spread files", ha="center", transform=a1.transAxes)
    a1.legend(fontsize=8)
    for key, style, label in (("omb_rms", "o-", "OmB RMS"), ("oma_rms", "s-", "OmA RMS"),
                              ("prior_spread", "o:", "prior spread of H(x)"),
                              ("posterior_spread", "s:", "posterior spread of H(x)")):
        a2.plot(cyc, [s.obs.get("all", {}).get(key, np.nan) for s in scores], style, label=label)
    a2.set_title("observation space (used observations)")
    a2.set_xlabel("cycle")
    a2.legend(fontsize=8)
    for a in (a1, a2):
        a.set_xticks(cyc)
    return _png(fig)


def fig_obs_by_kind(scores: list[CycleScores]) -> bytes:
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.2))
    cyc = [s.cycle for s in scores]
    kinds = [k for k in dict.fromkeys(k for s in scores for k in s.obs)]
    kinds = [k for k in kinds if k != "all"] or ["all"]
    for k in kinds:
        for key, style in (("omb", "o-"), ("oma", "s--")):
            a1.plot(cyc, [s.obs.get(k, {}).get(f"{key}_rms", np.nan) for s in scores], style, label=f"{k} {key.upper()}")
            a2.plot(cyc, [s.obs.get(k, {}).get(f"{key}_bias", np.nan) for s in scores], style, label=f"{k} {key.upper()}")
    a1.set_title("OmB / OmA RMS per kind")
    a2.set_title("OmB / OmA bias (mean) per kind")
    a2.axhline(0.0, color="0.6", lw=0.8)
    for a in (a1, a2):
        a.set_xlabel("cycle")
        a.set_xticks(cyc)
        a.legend(fontsize=7)
    return _png(fig)


def fig_qc(scores: list[CycleScores]) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.0))
    cyc = [s.cycle for s in scores]
    g = np.array([s.qc.get("gross", 0) for s in scores])
    b = np.array([s.qc.get("buddy", 0) for s in scores])
    u = np.array([s.qc.get("used", 0) for s in scores])
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
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 2.8))
    cyc = [s.cycle for s in scores]
    ax.plot(cyc, [s.inflation_mean if s.inflation_mean is not None else np.nan for s in scores], "o-")
    ax.set_xticks(cyc)
    ax.set_xlabel("cycle")
    ax.set_ylabel("mean covariance factor")
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.set_title("adaptive inflation (mean over state rows)")
    return _png(fig)


def _lonlat(path: Path, name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Longitude and latitude of every point of ``name`` (its shape), from its CF coordinates."""
    import netCDF4

    with netCDF4.Dataset(path) as ds:
        v = ds.variables[name]
        cands = str(getattr(v, "coordinates", "")).split() + list(v.dimensions)
        lon = lat = None
        for c in cands:
            if c not in ds.variables:
                continue
            cv = ds.variables[c]
            sn, un = str(getattr(cv, "standard_name", "")), str(getattr(cv, "units", ""))
            if sn == "longitude" or un.startswith("degrees_e") or (lon is None and "lon" in c.lower()):
                lon = c
            elif sn == "latitude" or un.startswith("degrees_n") or (lat is None and "lat" in c.lower()):
                lat = c
        if lon is None or lat is None:
            return None
        lo, la = np.asarray(ds.variables[lon][:], float), np.asarray(ds.variables[lat][:], float)
        if lo.shape == v.shape and la.shape == v.shape:
            return lo, la
        if lo.ndim == 1 and la.ndim == 1 and v.ndim >= 2 and v.shape[-2:] == (la.size, lo.size):
            LO, LA = np.meshgrid(lo, la)
            return np.broadcast_to(LO, v.shape), np.broadcast_to(LA, v.shape)
        return None


def fig_map(values: np.ndarray, where: tuple[np.ndarray, np.ndarray] | None, title: str, diverging: bool) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
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


def map_figures(expdir: Path) -> list[tuple[str, str, bytes]]:
    """``(id, title, png)`` of the last cycle's analysis mean, increment and spread per state variable."""
    cycles = [(k, d) for k, d in _cycle_dirs(expdir) if (d / "analysis_mean.nc").is_file()]
    if not cycles:
        return []
    k, cdir = cycles[-1]
    mean_f, spread_f = cdir / "analysis_mean.nc", cdir / "analysis_spread.nc"
    out = []
    for n in _mean_vars(mean_f, _state_variables(expdir)):
        mean = _read(mean_f, n)
        where = _lonlat(mean_f, n)
        out.append((f"map-{n}-mean", f"{n}: analysis mean, cycle {k}", fig_map(mean, where, f"{n} analysis mean, cycle {k}", False)))
        inc_f = cdir / f"{n}_analysis_increment.nc"
        if inc_f.is_file():
            inc = _read(inc_f, f"{n}_analysis_increment").reshape(-1)
            full = np.full(mean.shape, np.nan)
            valid = np.isfinite(mean)
            if inc.size == mean.size:
                full = inc.reshape(mean.shape)
            elif inc.size == int(valid.sum()):
                full[valid] = inc
            else:
                full = None
            if full is not None:
                out.append((f"map-{n}-increment", f"{n}: analysis increment, cycle {k}",
                            fig_map(full, where, f"{n} increment (analysis - forecast mean), cycle {k}", True)))
        elif (cdir / OBS_DIAG).is_file() and _has(cdir / OBS_DIAG, "lon"):
            # No forecast mean saved ([analysis_output] statistics = false): the increment at the observations.
            od = cdir / OBS_DIAG
            inc = _read(od, "posterior_mean") - _read(od, "prior_mean")
            out.append((f"map-{n}-increment", f"analysis increment at the observations, cycle {k}",
                        fig_map(inc, (_read(od, "lon"), _read(od, "lat")),
                                f"increment of H(x) at the observations (posterior - prior mean), cycle {k}", True)))
        if spread_f.is_file():
            out.append((f"map-{n}-spread", f"{n}: analysis spread, cycle {k}",
                        fig_map(_read(spread_f, n), where, f"{n} analysis spread, cycle {k}", False)))
    return out


# -- the page -------------------------------------------------------------------------------

def build_figures(expdir: Path, truth: str | None = None) -> tuple[Report, list[tuple[str, str, bytes]]]:
    """The report and every figure ``(id, title, png bytes)`` of the experiment in ``expdir``."""
    rep = load_report(expdir)
    scores = collect_scores(rep.expdir, truth)
    makers: list[tuple[str, str, Any]] = [("timing", "time per cycle", lambda: fig_timing(rep))]
    if any(s.spread or s.rmse or s.obs for s in scores):
        makers.append(("scores", "RMSE and spread over cycles", lambda: fig_scores(scores)))
    if any(s.obs for s in scores):
        makers += [("obs-by-kind", "OmB / OmA per observation kind", lambda: fig_obs_by_kind(scores)),
                   ("qc", "quality control counts", lambda: fig_qc(scores))]
    if scores:
        if any(s.inflation_mean is not None for s in scores):
            makers.append(("inflation", "adaptive inflation", lambda: fig_inflation(scores)))
    makers.append(("maps", "maps", lambda: map_figures(rep.expdir)))
    figs: list[tuple[str, str, bytes]] = []
    for fid, title, make in progress(makers, desc="report: figures"):
        res = make()
        if isinstance(res, list):
            figs.extend(res)
        else:
            figs.append((fid, title, res))
    return rep, figs


def _missing_note(figs: list[tuple[str, str, bytes]]) -> str:
    """A line naming the figures the experiment's files could not give, and why."""
    have = {f[0] for f in figs}
    why = []
    if "scores" not in have:
        why.append("no analysis mean/spread or obs_diag.nc files in the cycle directories: no scores")
    if "obs-by-kind" not in have:
        why.append("no obs_diag.nc (an analysis other than the built-in one?): no OmB/OmA per kind, no QC counts")
    if not any(f.startswith("map-") for f in have):
        why.append("no analysis_mean.nc ([analysis_output] mean_spread_files = false?): no maps")
    return f"<p><b>Not shown:</b> {html.escape('; '.join(why))}.</p>" if why else ""


def write_html(directory: str | Path, out: str | Path | None = None, *, truth: str | None = None) -> Path:
    """Write the report page of the experiment ``directory`` names (see :func:`enkflow.report.find_expdir`)
    to ``out`` (default ``EXPDIR/report.html``), atomically; returns its path."""
    from enkflow.fsutil import atomic_output

    rep, figs = build_figures(Path(directory), truth)
    path = Path(out) if out is not None else rep.expdir / "report.html"
    if not rep.cycles:
        raise EnkflowError(f"{rep.expdir}: no finished cycle to report yet")
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>enkflow report: {html.escape(str(rep.expdir))}"
             "</title><style>body{font-family:sans-serif;max-width:1100px;margin:1em auto;padding:0 1em}"
             "figure{margin:1em 0;border-top:1px solid #ddd}img{max-width:100%}pre{background:#f6f6f6;padding:.5em;"
             "overflow-x:auto;font-size:12px}</style></head><body>",
             f"<h1>enkflow experiment report</h1><p>Run directory: <code>{html.escape(str(rep.expdir))}</code>; "
             f"{len(rep.cycles)} cycle(s), {rep.mode} mode.</p>",
             _missing_note(figs),
             "<h2>Contents</h2><ul>" + "".join(f"<li><a href='#{fid}'>{html.escape(t)}</a></li>" for fid, t, _ in figs)
             + "<li><a href='#table'>timing table</a></li></ul>"]
    for fid, title, png in figs:
        b64 = base64.b64encode(png).decode("ascii")
        parts.append(f"<figure id='{fid}'><h2>{html.escape(title)}</h2>"
                     f"<img alt='{html.escape(title)}' src='data:image/png;base64,{b64}'></figure>")
    parts.append(f"<h2 id='table'>timing table</h2><pre>{html.escape(render_report(rep))}</pre></body></html>")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as tmp:
        tmp.write_text("\n".join(parts))
    return path
