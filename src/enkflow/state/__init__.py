"""The state vector: which variables of a restart file, in which order, with which mask and
coordinates (:class:`StateLayout`)."""

from enkflow.state.config import MaskConfig, StateConfig
from enkflow.state.coords import CoordAxis
from enkflow.state.layout import Piece, StateLayout, StateVariable
from enkflow.state.mask import mask_index

__all__ = ["CoordAxis", "MaskConfig", "Piece", "StateConfig", "StateLayout", "StateVariable", "mask_index"]
