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
from collections.abc import Callable
from pathlib import Path

from enkflow.errors import EnkflowError
from enkflow.fsutil import atomic_output
from enkflow.progress import progress
from enkflow.report.figures import fig_inflation, fig_obs_by_kind, fig_qc, fig_scores, fig_timing
from enkflow.report.maps import map_figures
from enkflow.report.scores import collect_scores
from enkflow.report.text import render_report
from enkflow.report.timing import Report, load_report

Figure = tuple[str, str, bytes]  # (id, title, PNG bytes)


def build_figures(expdir: Path, truth: str | None = None) -> tuple[Report, list[Figure]]:
    """The report and every figure ``(id, title, png bytes)`` of the experiment in ``expdir``."""
    rep = load_report(expdir)
    scores = collect_scores(rep.expdir, truth).cycles
    makers: list[tuple[str, str, Callable[[], bytes | list[Figure]]]] = [
        ("timing", "time per cycle", lambda: fig_timing(rep))]
    if any(s.variables or s.kinds for s in scores):
        makers.append(("scores", "RMSE and spread over cycles", lambda: fig_scores(scores)))
    if any(s.kinds for s in scores):
        makers += [("obs-by-kind", "OmB / OmA per observation kind", lambda: fig_obs_by_kind(scores)),
                   ("qc", "quality control counts", lambda: fig_qc(scores))]
    if any(s.inflation_mean is not None for s in scores):
        makers.append(("inflation", "adaptive inflation", lambda: fig_inflation(scores)))
    makers.append(("maps", "maps", lambda: map_figures(rep.expdir)))
    figs: list[Figure] = []
    for fid, title, make in progress(makers, desc="report: figures"):
        res = make()
        if isinstance(res, list):
            figs.extend(res)
        else:
            figs.append((fid, title, res))
    return rep, figs


def _missing_note(figs: list[Figure]) -> str:
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
