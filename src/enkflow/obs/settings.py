"""What the analysis needs, beyond the file, to turn an observation file into observations and H."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from enkflow.config import LocalizationConfig
from enkflow.obs.config import ObsSettingsConfig


class _HasForecastLength(Protocol):
    @property
    def forecast_length(self) -> float: ...


class _HasLocalization(Protocol):
    @property
    def localization(self) -> LocalizationConfig | None: ...


class ExperimentSections(Protocol):
    """The sections of an :class:`~enkflow.experiment.config.ExperimentConfig` that
    :meth:`ObsSettings.from_experiment` reads (``[observations]``, ``[experiment]``, ``[analysis]``)."""

    @property
    def observations(self) -> ObsSettingsConfig: ...

    @property
    def experiment(self) -> _HasForecastLength: ...

    @property
    def analysis(self) -> _HasLocalization | None: ...


@dataclass(frozen=True)
class ObsSettings:
    """What the analysis needs to turn a file into observations and H: the ``[observations]`` keys,
    the localization (for the kinds' radii) and the time window (relative to the analysis time).

    ``window`` None: times are not checked (a file without ``time`` needs none)."""

    config: ObsSettingsConfig = field(default_factory=ObsSettingsConfig)
    localization: LocalizationConfig | None = None
    window: tuple[float, float] | None = None

    @classmethod
    def from_experiment(cls, cfg: ExperimentSections) -> "ObsSettings":
        """From an :class:`~enkflow.experiment.config.ExperimentConfig`: window default
        ``[-forecast_length, 0]`` (the forecast that ends at the analysis)."""
        o = cfg.observations
        window = o.window if o.window is not None else (-float(cfg.experiment.forecast_length), 0.0)
        loc = cfg.analysis.localization if cfg.analysis is not None else None
        return cls(ObsSettingsConfig.model_validate(o.model_dump(include=set(ObsSettingsConfig.model_fields))),
                   loc, window)
