"""Observation sets and observation operators."""

from enkflow.obs.obsset import ObsSet

__all__ = ["ObsSet"]
