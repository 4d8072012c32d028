"""Observation settings of the experiment file: how H is built, the kinds, the time window, QC.

These are the keys of ``[observations]`` beyond the file and the operator stage
(``enkflow.experiment.config.ObservationsSection`` holds them)::

    [observations]
    file = "obs/obs_{cycle:03d}.nc"
    interpolation = "bilinear"        # "index" (state_index), "nearest", "bilinear"
    window = [-6.0, 0.0]              # observation times allowed, relative to the analysis time

    [observations.qc]
    gross_sigma = 5.0                 # reject |y - H xbar| > 5 sqrt(sigma_o^2 + sigma_b^2)
    buddy_radius = 500.0              # background-departure buddy check (localization units)
    buddy_sigma = 3.0

    [observations.kinds.radiosonde]
    code = 1                          # the file's kind code (or named by its flag_meanings)
    error_factor = 1.5                # sigma_o of this kind multiplied by 1.5
    radius = 800.0                    # its localization radius (analysis.localization's units, convention)
    qc_sigma = 4.0                    # its gross-error threshold k
    variable = "t"                    # the state variable it observes (nearest/bilinear, several variables)

See docs/configuration.md and docs/analysis.md ("Observation operators", "Quality control").
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from enkflow.config import Strict
from enkflow.obs.registry import operator_names


class KindConfig(Strict):
    """``[observations.kinds.NAME]``: the settings of one observation kind."""

    code: int | None = Field(default=None, description="the kind code in the file's 'kind' variable; default: the "
                                                        "code whose flag_meanings entry is NAME")
    error_factor: float = Field(default=1.0, gt=0, description="multiplies the file's error_std of this kind")
    radius: float | None = Field(default=None, gt=0, description="localization radius of this kind (units and "
                                                                 "convention of analysis.localization); default: that one")
    qc_sigma: float | None = Field(default=None, gt=0, description="gross-error threshold k of this kind; default: "
                                                                   "observations.qc.gross_sigma")
    variable: str | None = Field(default=None, description="state variable this kind observes (nearest/bilinear); "
                                                           "default: the only state variable")


class QCConfig(Strict):
    """``[observations.qc]``: quality control, decided from the full H X (the same on every rank)."""

    gross_sigma: float | None = Field(default=None, gt=0, description="reject where |y - H xbar| > k sqrt(sigma_o^2 + "
                                                                      "sigma_b^2); unset: no gross-error check")
    buddy_radius: float | None = Field(default=None, gt=0, description="buddy check radius (km on the sphere, the "
                                                                       "units of the state's coordinates otherwise); "
                                                                       "unset: no buddy check")
    buddy_sigma: float = Field(default=3.0, gt=0, description="reject where the normalized departure differs from "
                                                              "its buddies' mean by more than this")


class ObsSettingsConfig(Strict):
    """The observation keys (mixed into ``ObservationsSection``)."""

    # The observation operator H, by its name in enkflow.obs.registry: index (H x = x[state_index], the file names
    # the state row), nearest (the state point nearest the observation's coordinates), bilinear (interpolation on a
    # regular lon-lat or Cartesian grid).
    interpolation: str = Field(default="index", description="'index' (the file's state_index), "
                               "'nearest' or 'bilinear' (the file's coordinates)")
    window: tuple[float, float] | None = Field(default=None, description="[start, end] of the observation times, "
                                               "relative to the analysis time; default [-forecast_length, 0]")
    kinds: dict[str, KindConfig] = Field(default_factory=dict, description="settings per observation kind; when "
                                         "given, every kind in a file must be one of them")
    qc: QCConfig = QCConfig()

    @field_validator("interpolation", mode="before")
    @classmethod
    def _registered(cls, v: object) -> object:
        names = operator_names()
        if isinstance(v, str) and v in names:
            return v
        # The message of an Enum field (the names were one), so that configuration errors read the same.
        quoted = [repr(n) for n in names]
        expected = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
        raise PydanticCustomError("enum", "Input should be {expected}", {"expected": expected})

    @model_validator(mode="after")
    def _window_and_codes(self) -> "ObsSettingsConfig":
        if self.window is not None and not self.window[0] <= self.window[1]:
            raise ValueError(f"window start {self.window[0]} is after its end {self.window[1]}")
        seen: dict[int, str] = {}
        for name, k in self.kinds.items():
            if k.code is not None:
                if k.code in seen:
                    raise ValueError(f"kinds '{seen[k.code]}' and '{name}' have the same code {k.code}")
                seen[k.code] = name
        return self
