"""The diagnostics of one cycle's analysis, as :func:`enkflow.experiment.step.analyse` records them.

:class:`CycleDiagnostics` holds them typed; :meth:`CycleDiagnostics.as_dict` gives the flat
mapping that events, timing files, reports and the JSON of ``enkflow bench land`` show, with
the keys (and their order) they have always had. Seconds are wall-clock seconds of this rank
unless a name says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BalanceReport:
    """How the rows of a local analysis were split over the ranks, and what each rank spent.

    The ``rank_*`` lists have one entry per rank and are the same on every rank."""

    imbalance_est: float  # max / mean of the ranks' estimated work
    imbalance_cpu: float  # max / mean of the ranks' CPU seconds in the local filter
    imbalance_wall: float  # max / mean of the ranks' wall seconds in the local filter
    balance_s: float  # estimating the work of every row and splitting it
    redistribute_s: float  # moving the rows to the ranks that analyse them and back
    wait_s: float  # this rank's wait for the slowest rank before the rows move back
    balanced: bool  # rows of equal estimated work (else the store's row blocks)
    rank_analysis_s: list[float]
    rank_cpu_s: list[float]
    rank_est_work: list[float]  # share of the total estimated work
    rank_rows: list[float]
    rank_search_s: list[float]  # the local filter's search for local observations
    rank_kernel_s: list[float]  # the local filter's transforms

    def scalars(self) -> dict[str, float]:
        return {"imbalance_est": self.imbalance_est, "imbalance_cpu": self.imbalance_cpu,
                "imbalance_wall": self.imbalance_wall, "balance_s": self.balance_s,
                "redistribute_s": self.redistribute_s, "wait_s": self.wait_s, "balanced": float(self.balanced)}

    def per_rank(self) -> dict[str, list[float]]:
        return {"rank_analysis_s": self.rank_analysis_s, "rank_cpu_s": self.rank_cpu_s,
                "rank_est_work": self.rank_est_work, "rank_rows": self.rank_rows,
                "rank_search_s": self.rank_search_s, "rank_kernel_s": self.rank_kernel_s}


@dataclass(frozen=True)
class ObsLayoutReport:
    """Where one cycle's observations lived on the ranks of the analysis (:class:`enkflow.config.ObsLayout`).
    The ``rank_*`` lists have one entry per rank and are the same on every rank."""

    distributed: bool  # each rank held the observations its domains see (else every rank held all)
    rank_obs_held: list[float]  # the most observations the rank held at once for its local analyses (a window and its halo)
    rank_obs_owned: list[float]  # observations the rank computed H(x), QC and statistics for
    rank_obs_bytes: list[float]  # the largest observation-space arrays the rank held at once, bytes
    rank_hx_bytes: list[float]  # bytes the rank sent and received to assemble H(x) of the forecast
    # Seconds of the local analysis spent on the windows' observations: waiting for the other ranks
    # to reach each window, then exchanging (0 where every rank held every observation).
    rank_window_s: list[float]

    def per_rank(self) -> dict[str, float | list[float]]:
        return {"obs_distributed": float(self.distributed), "rank_obs_held": self.rank_obs_held,
                "rank_obs_owned": self.rank_obs_owned, "rank_obs_bytes": self.rank_obs_bytes,
                "rank_hx_bytes": self.rank_hx_bytes, "rank_window_s": self.rank_window_s}


@dataclass(frozen=True)
class LocalFilterStats:
    """The local filter's statistics, accumulated over its life (every cycle it analysed)."""

    mean_local_obs: float  # observations per domain
    search_s: float
    kernel_s: float


@dataclass(frozen=True)
class InflationSummary:
    """The adaptive inflation factors of every state row after the analysis."""

    mean: float
    min: float
    max: float


@dataclass
class CycleDiagnostics:
    """One cycle's analysis: the observations used and their fit, and where the time went.

    ``omb_rms`` / ``oma_rms``: root mean square of observation minus forecast / analysis mean
    over the ``n_obs`` observations used; ``qc``: the quality control's counts (``qc_rejected``,
    ``qc_gross``, ``qc_buddy``, ``qc_rejected:KIND``); ``rmse_prior`` / ``rmse_analysis``: of
    the forecast / analysis mean against the truth, where one is known."""

    n_obs: int = 0
    omb_rms: float = 0.0
    oma_rms: float = 0.0
    balance: BalanceReport | None = None
    obs_layout: ObsLayoutReport | None = None
    qc: dict[str, float] = field(default_factory=dict)
    local: LocalFilterStats | None = None
    rmse_prior: float | None = None
    rmse_analysis: float | None = None
    inflation: InflationSummary | None = None
    analysis_s: float = 0.0  # gather excepted, up to the scatter
    obs_diag_s: float | None = None  # the observation-space diagnostics file
    stats_s: float | None = None  # the ensemble statistics handed to the statistics sink

    def record(self) -> dict[str, float]:
        """The numbers known before the analysis is stored (what the member files' completion
        record holds, :class:`~enkflow.experiment.file_store.FileStore`): every scalar but
        ``stats_s``, in the order of :meth:`as_dict`."""
        out = {"n_obs": float(self.n_obs), "omb_rms": self.omb_rms, "oma_rms": self.oma_rms}
        if self.balance is not None:
            out.update(self.balance.scalars())
        out.update(self.qc)
        if self.local is not None:
            out.update(mean_local_obs=self.local.mean_local_obs, search_s=self.local.search_s,
                       kernel_s=self.local.kernel_s)
        if self.rmse_prior is not None and self.rmse_analysis is not None:
            out.update(rmse_prior=self.rmse_prior, rmse_analysis=self.rmse_analysis)
        if self.inflation is not None:
            out.update(inflation_mean=self.inflation.mean, inflation_min=self.inflation.min,
                       inflation_max=self.inflation.max)
        out["analysis_s"] = self.analysis_s
        if self.obs_diag_s is not None:
            out["obs_diag_s"] = self.obs_diag_s
        return out

    def as_dict(self) -> dict[str, float | list[float]]:
        """Every diagnostic by its name: :meth:`record`, the per-rank lists, ``stats_s``."""
        out: dict[str, float | list[float]] = dict(self.record())
        if self.balance is not None:
            out.update(self.balance.per_rank())
        if self.obs_layout is not None:
            out.update(self.obs_layout.per_rank())
        if self.stats_s is not None:
            out["stats_s"] = self.stats_s
        return out
