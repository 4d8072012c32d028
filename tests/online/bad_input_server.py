"""The server of test_online_bad_input's N-to-M case: ``mpiexec -n P python bad_input_server.py DIR``.

Writes its address to ``DIR/address`` (and the internal bus's to ``DIR/bus``), its events to
``DIR/events.jsonl`` and the final ensemble (every rank's rows) to ``DIR/final.npy``.
"""

import sys
from pathlib import Path

import numpy as np

from enkflow.jobs.events import EventLog
from enkflow.online import Server
from enkflow.parallel import get_comm
from test_online_bad_input import CYCLES, problem, server_config


def main(tmp: Path) -> int:
    comm = get_comm()
    server = Server(problem(), server_config(address_file=tmp / "address"), comm=comm, events=EventLog(tmp / "events.jsonl"))
    if comm.rank == 0 and server.bus is not None:  # the ranks' internal bus, for the test to send junk to
        (tmp / "bus").write_text(server.bus.address)
    server.run(CYCLES)
    X = comm.allgather_rows(np.ascontiguousarray(server.store.parts[0]))
    if comm.rank == 0:
        np.save(tmp / "final.npy", X)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
