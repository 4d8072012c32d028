"""The settings summary at the top of the report page: what the experiment was run with (its
``config.json``: filter, ensemble size, localization, inflation, QC, cycles, mode, truth) and the
observation counts per kind its scores hold."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from enkflow.config import LocalizationConfig, Metric
from enkflow.report.score_figures import kind_label
from enkflow.report.score_types import ExperimentScores


@dataclass(frozen=True)
class Setting:
    """One row of the summary: what it is, and its value in words."""

    label: str
    value: str


def _localization(loc: dict[str, Any]) -> str:
    if not loc or loc.get("radius") is None:
        return "none"
    metric = Metric(loc.get("metric") or LocalizationConfig.model_fields["metric"].default)
    units = "km" if metric is Metric.SPHERE else "in the units of the state's coordinates"
    text = (f"radius {loc['radius']:g} ({loc.get('convention', 'half-width')}, {units}), metric {metric.value}, "
            f"taper {loc.get('taper')}")
    if loc.get("max_obs"):
        text += f", at most {loc['max_obs']} observations per point"
    if loc.get("vertical_radius") is not None:
        text += f"; vertical radius {loc['vertical_radius']:g} on {loc.get('vertical_coordinate')}"
    return text


def _inflation(inf: dict[str, Any]) -> str:
    fixed = [f"{key} {inf[key]:g}" for key in ("prior", "posterior", "rtpp", "rtps") if inf.get(key) not in (None, 0.0)]
    adaptive = inf.get("adaptive") or "none"
    text = "fixed: " + (", ".join(fixed) if fixed else "none")
    if adaptive != "none":
        text += f"; adaptive: {adaptive} (initial {inf.get('adaptive_initial')}, target {inf.get('adaptive_target')})"
    else:
        text += "; adaptive: none"
    return text


def _qc(obs: dict[str, Any], enabled: bool) -> str:
    """``enabled``: the report's one decision whether QC ran (:attr:`ExperimentScores.qc_enabled`, which the
    QC panel follows)."""
    if not enabled:
        return "off"
    qc = obs.get("qc") or {}
    parts = []
    if qc.get("gross_sigma") is not None:
        parts.append(f"gross-error check at {qc['gross_sigma']:g} sigma")
    per_kind = [f"{kind_label(name)} at {k['qc_sigma']:g} sigma" for name, k in (obs.get("kinds") or {}).items()
                if isinstance(k, dict) and k.get("qc_sigma") is not None]
    if per_kind:
        parts.append("gross-error check of " + ", ".join(per_kind))
    if qc.get("buddy_radius") is not None:
        parts.append(f"buddy check within {qc['buddy_radius']:g} at {qc.get('buddy_sigma', 3.0):g} sigma")
    return ", ".join(parts)


def _counts(scores: ExperimentScores) -> str:
    """Per kind: used observations per cycle (min-max) and the rejected ones over all cycles."""
    kinds = dict.fromkeys(k for c in scores.cycles for k in c.kinds)
    out = []
    for kind in kinds:
        used = [c.kinds[kind].n_used for c in scores.cycles if kind in c.kinds]
        rejected = sum(c.kinds[kind].n_gross + c.kinds[kind].n_buddy for c in scores.cycles if kind in c.kinds)
        span = f"{min(used)}" if min(used) == max(used) else f"{min(used)}-{max(used)}"
        out.append(f"{kind_label(kind)}: {span} used per cycle, {rejected} rejected in all")
    return "; ".join(out) if out else "no obs_diag.nc in the cycle directories"


def _cycles(exp: dict[str, Any], scores: ExperimentScores) -> str:
    first, n = exp.get("first_cycle"), exp.get("cycles")
    text = f"{first} to {first + n - 1} ({n} planned" if isinstance(first, int) and isinstance(n, int) else "? ("
    text += f", {len(scores.cycles)} with scores)"
    if exp.get("forecast_length") is not None:
        text += f", forecast length {exp['forecast_length']:g}"
    return text


def settings_summary(cfg: dict[str, Any], scores: ExperimentScores) -> list[Setting]:
    """The rows of the summary from the run's ``config.json`` (``cfg``) and its ``scores``."""
    exp, ana = cfg.get("experiment") or {}, cfg.get("analysis") or {}
    obs, state = cfg.get("observations") or {}, cfg.get("state") or {}
    rows = [
        Setting("mode", str(exp.get("mode", "?"))),
        Setting("filter", str(ana.get("method", "?"))),
        Setting("ensemble size N_e", str(exp.get("members", scores.members or "?"))),
        Setting("cycles", _cycles(exp, scores)),
        Setting("state", f"variables {', '.join(state.get('variables') or []) or '?'}; coordinates "
                         f"{', '.join(state.get('coordinates') or []) or 'none'}"),
        Setting("localization", _localization(ana.get("localization") or {})),
        Setting("inflation", _inflation(ana.get("inflation") or {})),
        Setting("quality control", _qc(obs, scores.qc_enabled)),
        Setting("observations", f"{obs.get('file', '?')}; {_counts(scores)}"),
        Setting("truth", scores.truth or "none configured ([verification] truth or --truth)"),
    ]
    if scores.free_run:
        rows.append(Setting("free run (no assimilation)", scores.free_run))
    return rows
