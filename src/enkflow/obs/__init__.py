"""Observation sets and observation operators."""

from enkflow.analysis.obsset import ObsSet
from enkflow.obs.operators import GivenHX, LinearObsOperator

__all__ = ["GivenHX", "LinearObsOperator", "ObsSet"]
