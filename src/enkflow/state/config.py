"""Configuration of the state vector: ``[state]`` in the experiment file.

Example::

    [state]
    variables = ["soil_moisture"]            # in state-vector order
    coordinates = ["land_lon", "land_lat"]   # optional; detected from CF attributes otherwise

    [state.mask]                             # optional: only the points where the mask is set
    variable = "landmask"
    values = [1]                             # default: every non-zero value
"""

from __future__ import annotations

from pydantic import Field, model_validator

from enkflow.config import Strict


class MaskConfig(Strict):
    """Selects the state points of gridded variables with a mask variable of the template file.

    The mask variable's dimensions must be the trailing dimensions of each masked state
    variable (a 2-D ``(lat, lon)`` mask serves ``(lat, lon)`` and ``(lev, lat, lon)`` variables;
    a 3-D variable is masked level by level).
    """

    variable: str = Field(min_length=1, description="name of the mask variable in the template file")
    values: list[int] | None = Field(default=None, description="mask values that select a point; default: non-zero")
    apply_to: list[str] | None = Field(
        default=None,
        description="state variables the mask applies to; default: every state variable whose trailing dimensions are the mask's",
    )


class StateConfig(Strict):
    """Which variables of the restart files form the state vector, in which order."""

    variables: list[str] = Field(min_length=1, description="state variables, in state-vector order")
    mask: MaskConfig | None = None
    coordinates: list[str] | None = Field(
        default=None,
        description="variables giving each state point's localization coordinates (lon, lat) or (x, y); "
        "default: CF longitude/latitude of each variable, else grid indices",
    )

    @model_validator(mode="after")
    def _unique(self) -> "StateConfig":
        seen: set[str] = set()
        for v in self.variables:
            if v in seen:
                raise ValueError(f"state variable '{v}' listed twice")
            seen.add(v)
        return self
