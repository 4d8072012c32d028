"""``enkflow report DIR --html``: one self-contained HTML page of an experiment, figures embedded.

In the order a data-assimilation scientist reads it (DAPPER's and DART obs_diag's habits):

1. the failure that stopped the run, where it failed; the **settings** (:mod:`.settings`);
2. the **scores** (:mod:`.scores`, drawn by :mod:`.score_figures`): forecast and analysis RMSE against
   the truth (a sawtooth from cycle 0, the free run beside it) and spread; observation-space consistency
   (OmB RMS against sqrt(prior spread^2 + sigma_o^2), their ratio); rank histograms; CRPS; OmB/OmA per kind;
   QC counts (QC on); the adaptive inflation (where adaptive);
3. **maps** in the state's own coordinates (:mod:`.maps`): analysis mean, increment with the observations,
   spread, analysis minus truth, for one cycle or every cycle;
4. **timing** last: the time bars and the table (:mod:`.timing`, :mod:`.text`).

A figure with nothing to show is left out, and the page says why in one line. Figures are PNG (matplotlib,
Agg backend) embedded as base64, so the page is one file.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from enkflow.errors import EnkflowError
from enkflow.fsutil import atomic_output
from enkflow.progress import progress
from enkflow.report.figures import fig_timing
from enkflow.report.files import run_config, state_coordinates
from enkflow.report.maps import Figure, MapCycles, map_figures
from enkflow.report.score_figures import (fig_consistency, fig_crps, fig_inflation, fig_obs_by_kind, fig_qc,
                                          fig_rank_hist, fig_rmse, kinds_with, variables)
from enkflow.report.score_types import ExperimentScores
from enkflow.report.scores import collect_scores
from enkflow.report.scores_table import write_scores_table
from enkflow.report.settings import Setting, settings_summary
from enkflow.report.text import render_report
from enkflow.report.timing import Report, load_report

STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:1em auto;padding:0 1em}"
         "figure{margin:1em 0;border-top:1px solid #ddd}img{max-width:100%}pre{background:#f6f6f6;padding:.5em;"
         "overflow-x:auto;font-size:12px}table#settings td{padding:2px 8px;vertical-align:top}"
         "table#settings td:first-child{font-weight:bold;white-space:nowrap}.failure{background:#fdd;padding:.5em}")


@dataclass
class Page:
    """What the page shows: the score figures, the maps, the timing figure, and a line per figure left out."""

    scores: list[Figure] = field(default_factory=list)
    maps: list[Figure] = field(default_factory=list)
    timing: list[Figure] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


Maker = tuple[str, str, Callable[[], bytes]]  # (id, title, draws the PNG)


def _score_makers(s: ExperimentScores) -> tuple[list[Maker], list[str]]:
    """The score figures the scores can fill, and why each other one is left out."""
    kinds = kinds_with(s, lambda k: k.n_used > 0)
    with_rank = kinds_with(s, lambda k: k.rank_hist is not None)
    with_crps = kinds_with(s, lambda k: k.crps_prior is not None)
    makers: list[Maker] = []
    missing: list[str] = []

    def want(ok: bool, maker: Maker, why: str) -> None:
        if ok:
            makers.append(maker)
        else:
            missing.append(f"{maker[1]}: {why}")

    obs_why = "no obs_diag.nc with used observations in the cycle directories"
    rmse_title = ("RMSE against the truth and spread, forecast and analysis" if s.truth is not None else
                  "spread, forecast and analysis (no truth configured: no RMSE)")
    want(bool(variables(s)), ("fig-rmse", rmse_title, lambda: fig_rmse(s)),
         "no analysis mean/spread files in the cycle directories")
    want(bool(kinds), ("fig-consistency", "observation-space consistency", lambda: fig_consistency(s, kinds)), obs_why)
    want(bool(with_rank), ("fig-rank-hist", "rank histograms (prior)", lambda: fig_rank_hist(s, with_rank)),
         "obs_diag.nc has no prior_rank")
    want(bool(with_crps), ("fig-crps", "CRPS, prior and posterior", lambda: fig_crps(s, with_crps)),
         "obs_diag.nc has no prior_crps")
    want(bool(kinds), ("fig-obs-by-kind", "OmB / OmA per observation kind", lambda: fig_obs_by_kind(s, kinds)), obs_why)
    want(s.qc_enabled and bool(s.cycles), ("fig-qc", "quality control counts", lambda: fig_qc(s)),
         "quality control is off")
    want(any(c.inflation_mean is not None for c in s.cycles),
         ("fig-inflation", "adaptive inflation", lambda: fig_inflation(s)), "no adaptive inflation")
    return makers, missing


def build_page(rep: Report, scores: ExperimentScores, map_cycle: int | MapCycles = MapCycles.LAST) -> Page:
    """Every figure of the page (scores, maps, timing) and the lines that say what is left out."""
    makers, missing = _score_makers(scores)
    page = Page(missing=missing)
    for fid, title, make in progress(makers, desc="report: figures"):
        page.scores.append((fid, title, make()))
    truth = {} if scores.truth is None else {
        c.cycle: p for c in scores.cycles if (p := Path(scores.truth.format(cycle=c.cycle))).is_file()}
    maps = map_figures(rep.expdir, map_cycle, [c.cycle for c in scores.cycles], truth, state_coordinates(rep.expdir))
    page.maps, page.missing = maps.figures, page.missing + list(dict.fromkeys(maps.missing))
    if scores.truth is None:
        page.missing.append("analysis minus truth maps: no truth configured")
    if rep.cycles:
        page.timing.append(("timing", "time per cycle", fig_timing(rep)))
    else:
        page.missing.append("time per cycle: no finished cycle")
    return page


def _figure_html(fig: Figure) -> str:
    fid, title, png = fig
    b64 = base64.b64encode(png).decode("ascii")
    return (f"<figure id='{fid}'><h3>{html.escape(title)}</h3>"
            f"<img alt='{html.escape(title)}' src='data:image/png;base64,{b64}'></figure>")


def _settings_html(rows: list[Setting]) -> str:
    body = "".join(f"<tr><td>{html.escape(r.label)}</td><td>{html.escape(r.value)}</td></tr>" for r in rows)
    return f"<h2>settings</h2><table id='settings'>{body}</table>"


def page_html(rep: Report, scores: ExperimentScores, page: Page) -> str:
    """The page's HTML: failure, settings, scores, maps, timing (bars and table)."""
    title = html.escape(str(rep.expdir))
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>enkflow report: {title}</title>"
             f"<style>{STYLE}</style></head><body>",
             f"<h1>enkflow experiment report</h1><p>Run directory: <code>{title}</code>; "
             f"{len(rep.cycles)} cycle(s) timed, {rep.mode} mode.</p>"]
    if rep.failure is not None:
        parts.append(f"<pre id='failure' class='failure'>{html.escape(chr(10).join(rep.failure.lines()))}</pre>")
    parts.append(_settings_html(settings_summary(run_config(rep.expdir), scores)))
    parts.append("<h2 id='scores'>scores</h2>" + "".join(_figure_html(f) for f in page.scores))
    parts.append("<h2 id='maps'>maps</h2>" + "".join(_figure_html(f) for f in page.maps))
    if page.missing:
        parts.append("<h2 id='not-shown'>not shown</h2><ul>"
                     + "".join(f"<li>{html.escape(m)}</li>" for m in page.missing) + "</ul>")
    parts.append("<h2 id='timing-section'>timing</h2>" + "".join(_figure_html(f) for f in page.timing)
                 + f"<pre id='timing-table'>{html.escape(render_report(rep))}</pre></body></html>")
    return "\n".join(parts)


def write_html(directory: str | Path, out: str | Path | None = None, *, truth: str | None = None,
               free_run: str | None = None, map_cycle: int | MapCycles = MapCycles.LAST) -> Path:
    """Write the report page of the experiment ``directory`` names (see :func:`enkflow.report.find_expdir`)
    to ``out`` (default ``EXPDIR/report.html``) and the scores table (``EXPDIR/scores.nc``, ``scores.csv``),
    each atomically; returns the page's path. ``truth``/``free_run``:
    templates with ``{cycle}`` overriding the run's ``[verification]``; ``map_cycle``: the cycle mapped."""
    rep = load_report(Path(directory))
    if not rep.cycles and rep.failure is None:
        raise EnkflowError(f"{rep.expdir}: no finished cycle to report yet")
    scores = collect_scores(rep.expdir, truth, free_run)
    page = build_page(rep, scores, map_cycle)
    write_scores_table(scores, rep.expdir)
    path = Path(out) if out is not None else rep.expdir / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as tmp:
        tmp.write_text(page_html(rep, scores, page))
    return path
