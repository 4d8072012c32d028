"""The typed per-cycle scores of an experiment, as the report page draws them and the tidy scores table
(``EXPDIR/scores.nc``, ``EXPDIR/scores.csv``) holds them.

State-space scores are in the state variable's own units; observation-space scores in the observation's
units. ``None`` marks a score the experiment's files cannot give (no truth configured, no forecast statistics
written, a kind without observations in that cycle), never a zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class VariableScores:
    """One state variable in one cycle: RMSE of an ensemble mean against the truth over the variable's valid
    points, and the ensemble spread sqrt(mean over points of the ensemble variance, ddof = 1)."""

    rmse_forecast: float | None = None  # forecast (background) mean - truth
    rmse_analysis: float | None = None  # analysis mean - truth
    rmse_free: float | None = None  # the no-assimilation reference - truth
    spread_forecast: float | None = None
    spread_analysis: float | None = None


@dataclass(frozen=True)
class KindScores:
    """One observation kind in one cycle, over its observations that passed quality control (the counts
    excepted). ``consistency`` = omb_rms / sqrt(prior_spread_ms + sigma_o_ms): about 1 for an ensemble whose
    spread and the observation error explain the departures (Desroziers et al. 2005; DART obs_diag's
    "total spread")."""

    n_used: int
    n_gross: int  # rejected by the gross-error check
    n_buddy: int  # rejected by the buddy check
    omb_bias: float | None = None  # mean(y - mean H(x_f))
    omb_rms: float | None = None
    oma_bias: float | None = None
    oma_rms: float | None = None
    prior_spread_ms: float | None = None  # mean over observations of the prior H(x) variance (ddof = 1)
    posterior_spread_ms: float | None = None
    sigma_o_ms: float | None = None  # mean observation-error variance
    consistency: float | None = None
    crps_prior: float | None = None  # mean over observations of the ensemble CRPS of prior H(x) against y
    crps_posterior: float | None = None
    rank_hist: np.ndarray | None = None  # (N + 1,) int64: counts of y's rank in the perturbed prior H(x)


@dataclass
class CycleScores:
    """The scores of one cycle: per state variable, per observation kind, and the adaptive inflation's mean
    factor (None without adaptive inflation)."""

    cycle: int
    variables: dict[str, VariableScores] = field(default_factory=dict)
    kinds: dict[str, KindScores] = field(default_factory=dict)
    inflation_mean: float | None = None


@dataclass
class ExperimentScores:
    """Every cycle's scores, the initial ensemble's (cycle 0: its mean and spread against the truth of cycle 0,
    in ``analysis``), and what the experiment was set up with."""

    cycles: list[CycleScores]
    initial: CycleScores | None = None
    truth: str | None = None  # the truth file template used, None without one
    free_run: str | None = None  # the no-assimilation reference's template, None without one
    members: int | None = None
    qc_enabled: bool = False
