"""The only place that touches MPI: a communicator and the row-block decomposition."""

from enkflow.parallel.blocks import RowBlocks
from enkflow.parallel.comm import Comm, SerialComm, get_comm

__all__ = ["Comm", "RowBlocks", "SerialComm", "get_comm"]
