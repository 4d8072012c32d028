"""The one configuration schema, loaded from TOML and validated.

Every section is a pydantic model that forbids unknown keys; a validation
failure becomes a :class:`~enkflow.errors.ConfigError` naming the dotted path
of the key at fault (``analysis.localization.radius``) and the file.

Sections are added here as subsystems grow; ``docs/configuration.md``
documents every key.
"""

from __future__ import annotations

import difflib
import tomllib
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from enkflow.errors import ConfigError


class Strict(BaseModel):
    """Base of every section: unknown keys are errors, values are not coerced loosely."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, use_enum_values=False)


class Method(str, Enum):
    """Analysis methods: global (one analysis) and local (one per domain)."""

    ETKF = "etkf"
    ESTKF = "estkf"
    DENKF = "denkf"
    ENKF = "enkf"
    LETKF = "letkf"
    LESTKF = "lestkf"
    ENKF_N = "enkf-n"
    LNETF = "lnetf"
    ENSRF = "ensrf"  # serial EnSRF/EAKF with covariance localization

    @property
    def is_local(self) -> bool:
        return self in (Method.LETKF, Method.LESTKF, Method.LNETF)

    @property
    def needs_localization(self) -> bool:
        """The methods that need an ``[analysis.localization]`` table. Not :attr:`is_local`: a filter
        may localize without analysing domain by domain (a serial filter localizes the
        state-observation distances)."""
        return self in (Method.LETKF, Method.LESTKF, Method.LNETF, Method.ENSRF)


class Taper(str, Enum):
    GASPARI_COHN = "gaspari-cohn"
    GAUSSIAN = "gaussian"
    STEP = "step"


class RadiusConvention(str, Enum):
    """How ``radius`` is read.

    ``half-width``: the Gaspari-Cohn half-width c (weight reaches 0 at 2c).
    ``cutoff``: PDAF's cut-off radius (weight reaches 0 at the cut-off; c = cutoff/2).
    """

    HALF_WIDTH = "half-width"
    CUTOFF = "cutoff"


class Metric(str, Enum):
    SPHERE = "sphere"  # great-circle distance in km, coordinates lon/lat in degrees
    CARTESIAN = "cartesian"  # Euclidean distance in the state coordinates' units, 1-3 coordinates
    PERIODIC = "periodic"  # 1-D index distance on a ring of `period` points


class Kernel(str, Enum):
    """``[analysis] kernel``: how a local filter computes its analyses (both exact)."""

    COMPILED = "compiled"  # exact; C, eight domains per SIMD batch (docs/analysis.md)
    REFERENCE = "reference"  # exact, per-domain LAPACK eigendecomposition


class ObsLayout(str, Enum):
    """``[analysis] observations``: where a local filter's observations live (the same results)."""

    DISTRIBUTED = "distributed"  # each rank holds the observations its domains see (docs/analysis.md)
    REPLICATED = "replicated"  # every rank holds every observation and H(x) is summed by one Allreduce


class LocalizationConfig(Strict):
    taper: Taper = Taper.GASPARI_COHN
    radius: float = Field(gt=0, description="see `convention`; km on the sphere, otherwise the units of the "
                          "state's coordinates (grid index steps where it has none)")
    convention: RadiusConvention = RadiusConvention.HALF_WIDTH
    metric: Metric = Metric.CARTESIAN
    period: float | None = Field(default=None, gt=0)
    max_obs: int | None = Field(default=None, ge=1, description="at most this many observations per local domain, "
                                "the nearest (an approximation: see docs/analysis.md); default: all within the radius")
    # Vertical localization (local filters, 3-D states): a second taper on the vertical distance; docs/analysis.md.
    vertical_radius: float | None = Field(default=None, gt=0, description="vertical radius (same convention), in "
                                          "levels or the vertical coordinate's units; unset: no vertical localization")
    vertical_coordinate: str | None = Field(default=None, description="a dimension of the state variables (the "
                                            "level index along it) or a variable of the restart file (its values)")
    vertical_taper: Taper | None = Field(default=None, description="default: taper")

    @model_validator(mode="after")
    def _period_for_ring(self) -> "LocalizationConfig":
        if self.metric is Metric.PERIODIC and self.period is None:
            raise ValueError("metric 'periodic' needs 'period' (the ring length, in the coordinate's units)")
        if self.vertical_radius is not None and self.vertical_coordinate is None:
            raise ValueError("vertical_radius needs vertical_coordinate (a dimension of the state variables, "
                             "e.g. 'lev', or a variable of the restart file)")
        return self


class AdaptiveInflation(str, Enum):
    """Adaptive prior inflation of the local filters (:mod:`enkflow.analysis.adaptive_inflation`)."""

    NONE = "none"
    MIYOSHI2011 = "miyoshi2011"  # Miyoshi (2011), the estimate's variance carried (docs/analysis.md)
    GHARAMTI2018 = "gharamti2018"  # El Gharamti (2018), inverse-gamma prior (DART's inf_flavor 5)
    ANDERSON2009 = "anderson2009"  # Anderson (2009), Gaussian prior (DART's inf_flavor 2)


class AdaptiveTarget(str, Enum):
    """``[analysis.inflation] adaptive_target``: the covariance an adaptive factor multiplies."""

    PRIOR = "prior"
    POSTERIOR = "posterior"  # gharamti2018, anderson2009 (El Gharamti et al. 2019's posterior inflation)


# Each scheme's defaults of the adaptive_* keys left unset (None): Miyoshi's sigma_b, DART's
# recommended filter_nml values (guide/inflation.rst) for the two DART schemes, with the lower bound 1
# (filter_nml's default; the guide suggests 0 for gharamti2018, which under-inflates on Lorenz-96:
# docs/analysis.md); the keys a scheme does not define are errors.
ADAPTIVE_DEFAULTS: dict[AdaptiveInflation, dict[str, float]] = {
    AdaptiveInflation.MIYOSHI2011: {"sd": 0.04, "sd_initial": 0.6, "minimum": 1.0, "maximum": 10.0},
    AdaptiveInflation.GHARAMTI2018: {"sd": 0.6, "sd_initial": 0.6, "minimum": 1.0, "maximum": 50.0, "damping": 0.9,
                                     "sd_max_change": 1.05},
    AdaptiveInflation.ANDERSON2009: {"sd": 0.6, "sd_initial": 0.6, "minimum": 1.0, "maximum": 50.0, "damping": 0.9},
}


# The adaptive scheme's keys of [analysis.inflation] and their values when no scheme is set.
_SCHEME_KEYS: dict[str, Any] = {"adaptive_initial": 1.0, "adaptive_sd": None, "adaptive_sd_initial": None,
                                "adaptive_minimum": None, "adaptive_maximum": None, "adaptive_relax": 0.0,
                                "adaptive_damping": None, "adaptive_sd_max_change": None,
                                "adaptive_target": AdaptiveTarget.PRIOR}


class InflationConfig(Strict):
    """Inflation; all default to no inflation. See :class:`enkflow.analysis.Inflation`."""

    prior: float = Field(default=1.0, ge=1.0, allow_inf_nan=False,
                         description="multiplicative prior factor (1/forgetting factor)")
    posterior: float = Field(default=1.0, ge=1.0, allow_inf_nan=False,
                             description="multiplicative factor on analysis anomalies")
    rtpp: float = Field(default=0.0, ge=0.0, le=1.0, description="relaxation to prior perturbations, alpha")
    rtps: float = Field(default=0.0, ge=0.0, le=1.0, description="relaxation to prior spread, alpha")
    # Adaptive inflation (local filters, ensrf): enkflow.analysis.adaptive_inflation, docs/analysis.md.
    adaptive: AdaptiveInflation = Field(default=AdaptiveInflation.NONE,
                                        description="none | miyoshi2011 | gharamti2018 | anderson2009")
    adaptive_initial: float = Field(default=1.0, gt=0.0, allow_inf_nan=False,
                                    description="covariance inflation factor at the first cycle")
    # None: the scheme's default (ADAPTIVE_DEFAULTS).
    adaptive_sd: float | None = Field(default=None, gt=0.0, allow_inf_nan=False,
                                      description="lower bound of the estimate's standard deviation")
    adaptive_sd_initial: float | None = Field(default=None, gt=0.0, allow_inf_nan=False,
                                              description="standard deviation of the estimate at the first cycle")
    adaptive_minimum: float | None = Field(default=None, ge=0.0, allow_inf_nan=False,
                                           description="lower bound of the estimate")
    adaptive_maximum: float | None = Field(default=None, gt=0.0, allow_inf_nan=False,
                                           description="upper bound of the estimate")
    adaptive_relax: float = Field(default=0.0, ge=0.0, le=1.0, description="miyoshi2011: relaxation towards adaptive_initial per cycle")
    adaptive_damping: float | None = Field(default=None, ge=0.0, le=1.0, description="gharamti2018, anderson2009: "
                                           "DART's inf_damping, factor <- 1 + damping (factor - 1) before each cycle")
    adaptive_sd_max_change: float | None = Field(default=None, ge=1.0, le=2.0, description="gharamti2018: DART's "
                                                 "inf_sd_max_change: a deviation that would grow by more than this "
                                                 "factor in one observation's update keeps its old value")
    adaptive_target: AdaptiveTarget = Field(default=AdaptiveTarget.PRIOR, description="prior | posterior (DART's schemes)")

    @model_validator(mode="after")
    def _adaptive_bounds(self) -> "InflationConfig":
        if self.adaptive is AdaptiveInflation.NONE:
            unused = [k for k, default in _SCHEME_KEYS.items() if getattr(self, k) != default]
            if unused:
                raise ValueError(f"{unused[0]} is a parameter of an adaptive scheme, and adaptive = 'none': set "
                                 "adaptive (miyoshi2011, gharamti2018, anderson2009) or leave it out")
            return self
        p = self.adaptive_parameters()
        defined = ADAPTIVE_DEFAULTS[self.adaptive]
        for key in ("damping", "sd_max_change"):
            if getattr(self, f"adaptive_{key}") is not None and key not in defined:
                raise ValueError(f"adaptive_{key} is not a parameter of adaptive = '{self.adaptive.value}'")
        if self.adaptive is AdaptiveInflation.MIYOSHI2011:
            if self.adaptive_target is not AdaptiveTarget.PRIOR:
                raise ValueError("adaptive = 'miyoshi2011' estimates prior inflation only (adaptive_target = 'prior')")
            if p["minimum"] <= 0:
                raise ValueError("adaptive_minimum must be > 0 for adaptive = 'miyoshi2011'")
        elif self.adaptive_relax != 0.0:
            raise ValueError(f"adaptive_relax is miyoshi2011's; adaptive = '{self.adaptive.value}' damps towards 1 "
                             "with adaptive_damping")
        if p["minimum"] > p["maximum"]:
            raise ValueError(f"adaptive_minimum ({p['minimum']}) is above adaptive_maximum ({p['maximum']})")
        if not p["minimum"] <= self.adaptive_initial <= p["maximum"]:
            raise ValueError(f"adaptive_initial ({self.adaptive_initial}) must lie in [adaptive_minimum, adaptive_maximum]"
                             f" = [{p['minimum']}, {p['maximum']}]")
        return self

    def adaptive_parameters(self) -> dict[str, Any]:
        """The parameters of the ``adaptive`` scheme (not none), the unset ones at its defaults:
        the keyword arguments of its class in :mod:`enkflow.analysis` (``initial``, ``sd``, ...)."""
        p: dict[str, Any] = dict(ADAPTIVE_DEFAULTS[self.adaptive], initial=self.adaptive_initial)
        for key in list(p):
            value = getattr(self, f"adaptive_{key}")
            if value is not None:
                p[key] = value
        if self.adaptive is AdaptiveInflation.MIYOSHI2011:
            p["relax"] = self.adaptive_relax
        else:
            p["target"] = self.adaptive_target
        return p


class EnKFNConfig(Strict):
    """``[analysis.enkf_n]``: the finite-size EnKF's options (:class:`enkflow.analysis.enkf_n.EnKFN`)."""

    xn: float = Field(default=1.0, gt=0.0, allow_inf_nan=False, description="certainty of the hyperprior, in "
                      "ensembles (DAPPER's xN): 1 fully agnostic, 2 for nearly linear, deterministic models")
    g: int = Field(default=0, ge=0, description="nullity correction of the hyperprior's log term (DAPPER's g)")
    rotate: bool = Field(default=False, description="turn the analysis anomalies by a random mean-preserving "
                         "rotation drawn from (seed, cycle) (DAPPER's rot=True)")


class LNETFConfig(Strict):
    """``[analysis.lnetf]``: the local nonlinear ensemble transform filter (Toedter & Ahrens 2015;
    DAPPER's ``LNETF``), :mod:`enkflow.analysis.lnetf`."""

    rs: float = Field(default=1.0, gt=0.0, allow_inf_nan=False, description="DAPPER's Rs: the observation error "
                      "standard deviations are multiplied by it in the particle weights (> 1 flattens them)")
    rotate: bool = Field(default=False, description="a random mean-preserving rotation of the analysis anomalies "
                         "(DAPPER's rot=True), one per cycle, the same for every domain")


# The method-option tables of [analysis] and the method each is for: a table given for another method is an error.
METHOD_TABLES: dict[str, Method] = {"enkf_n": Method.ENKF_N, "lnetf": Method.LNETF}


class AnalysisConfig(Strict):
    method: Method = Method.LETKF
    inflation: InflationConfig = InflationConfig()
    localization: LocalizationConfig | None = Field(default=None, validate_default=True)
    enkf_n: EnKFNConfig | None = None
    lnetf: LNETFConfig | None = None
    seed: int = 0
    kernel: Kernel = Kernel.COMPILED
    # Local filters, offline analysis: rows of equal estimated work per MPI rank (same result).
    balance: bool = True
    # Local filters on located rows: observations held by the ranks whose domains see them (same result).
    observations: ObsLayout = ObsLayout.DISTRIBUTED
    observation_windows: int = Field(default=2, ge=1, description="distributed observations: every rank analyses "
                                     "its domains in this many windows of about equal cost, holding one window's "
                                     "observations at a time (more: less memory, more waiting for each other)")

    @field_validator("localization", mode="after")
    @classmethod
    def _localization_for_the_method(cls, loc: LocalizationConfig | None, info: ValidationInfo) -> LocalizationConfig | None:
        method = info.data.get("method")  # absent when the method itself was invalid
        if loc is None and method is not None and method.needs_localization:
            raise ValueError(f"method '{method.value}' needs an [analysis.localization] table with 'radius'")
        return loc

    @field_validator(*METHOD_TABLES, mode="after")
    @classmethod
    def _table_for_the_method(cls, table: Strict | None, info: ValidationInfo) -> Strict | None:
        method, owner = info.data.get("method"), METHOD_TABLES[str(info.field_name)]
        if table is not None and method is not None and method is not owner:
            raise ValueError(f"[analysis.{info.field_name}] is for method '{owner.value}'; "
                             f"this study's method is '{method.value}'")
        return table

    @model_validator(mode="after")
    def _adaptive_for_the_method(self) -> "AnalysisConfig":
        adaptive = self.inflation.adaptive
        if adaptive is not AdaptiveInflation.NONE and not (self.method.is_local or self.method is Method.ENSRF):
            raise ValueError(f"inflation.adaptive = '{adaptive.value}' needs a local filter (letkf, lestkf, lnetf) or "
                             f"the serial filter (ensrf), not '{self.method.value}'")
        if self.method is Method.ENSRF and self.inflation.adaptive_target is not AdaptiveTarget.PRIOR:  # a scheme set
            raise ValueError("the serial filter (ensrf) estimates prior inflation only: leave adaptive_target out "
                             "(or 'prior')")
        return self

    @model_validator(mode="after")
    def _kernel_of_the_method(self) -> "AnalysisConfig":
        if self.method in (Method.LNETF, Method.ENSRF, Method.ENKF_N) and self.kernel is not Kernel.COMPILED:
            raise ValueError(f"kernel = '{self.kernel.value}' is a choice of letkf and lestkf; method "
                             f"'{self.method.value}' has one implementation (leave kernel out)")
        return self

    @model_validator(mode="after")
    def _serial_has_no_cap(self) -> "AnalysisConfig":
        if self.method is Method.ENSRF and self.localization is not None and self.localization.max_obs is not None:
            raise ValueError("localization.max_obs caps a local filter's domains; method 'ensrf' updates every row "
                             "within an observation's support: remove max_obs")
        return self


M = TypeVar("M", bound=BaseModel)


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc if not str(p).startswith("function-"))


def _step(tp: Any, part: Any) -> Any:
    """The type found at loc element ``part`` inside type ``tp`` (a model field, a list item, a dict value)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        # Pydantic names the union member in the loc when a union holds several models.
        for a in members:
            if isinstance(a, type) and a.__name__ == part:
                return a
        for a in members:
            found = _step(a, part)
            if found is not None:
                return found
        return None
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(str(part))
        return None if field is None else field.annotation
    args = typing.get_args(tp)
    if origin in (list, tuple, set, frozenset) and isinstance(part, int) and args:
        return args[0]
    if origin is dict and len(args) == 2:
        return args[1]
    return None


def _keys_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The valid keys of the table at ``loc`` in ``model`` (empty when it is not a model)."""
    tp: Any = model
    for part in loc:
        tp = _step(tp, part)
        if tp is None:
            return []
    candidates = [tp]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        candidates = list(typing.get_args(tp))
    keys: list[str] = []
    for c in candidates:
        if isinstance(c, type) and issubclass(c, BaseModel):
            keys += [f.alias or name for name, f in c.model_fields.items() if name not in keys]
    return keys


def _unknown_key_message(model: type[BaseModel], err: Any, missing: set[tuple[Any, ...]]) -> str:
    """'unknown key A.B, did you mean C?' for a forbidden extra key, naming what its typo left missing."""
    loc = tuple(err["loc"])
    parent, name = loc[:-1], str(loc[-1])
    valid = _keys_at(model, parent)
    where = _dotted(loc)
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    if close:
        msg = f"unknown key {where}, did you mean {close[0]}?"
        if parent + (close[0],) in missing:
            msg += f" ({close[0]} is required and missing)"
        return msg
    if valid:
        return f"unknown key {where}; valid keys here: {', '.join(valid)}"
    return f"unknown key {where}"


def validate(model: type[M], data: dict[str, Any], *, file: str | None = None, prefix: str = "") -> M:
    """Validate ``data`` against ``model``; the first error becomes a ConfigError with its key path.

    An unknown key is reported before any other error, with the nearest valid key: a
    typo'd required key also makes the real one missing, and one message names both.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        extras = [e for e in errors if e["type"] == "extra_forbidden"]
        err = extras[0] if extras else errors[0]
        key = _dotted(tuple(p for p in (prefix,) if p) + tuple(err["loc"]))
        if extras:
            missing = {tuple(e["loc"]) for e in errors if e["type"] == "missing"}
            msg = _unknown_key_message(model, err, missing)
            if prefix:
                msg = msg.replace("unknown key ", f"unknown key {prefix}.", 1)
        elif err["type"] == "missing":
            msg = "required key missing"
        else:
            msg = err["msg"].removeprefix("Value error, ")  # pydantic's prefix to the validators' own messages
        raise ConfigError(msg, key=key or None, file=file) from None


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; a syntax error becomes a ConfigError naming the file."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError("configuration file not found", file=str(p)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML: {exc}", file=str(p)) from None
