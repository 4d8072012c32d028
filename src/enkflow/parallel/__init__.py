"""The only place that touches MPI: a communicator and the row-block decomposition."""

from enkflow.parallel.blocks import RowBlocks
from enkflow.parallel.comm import Comm, Request, SerialComm, get_comm, node_names
from enkflow.parallel.leave import leave
from enkflow.parallel.program import find_program

__all__ = ["Comm", "Request", "RowBlocks", "SerialComm", "find_program", "get_comm", "leave", "node_names"]
