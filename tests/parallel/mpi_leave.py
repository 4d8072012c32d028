"""Run under mpiexec by test_leave.py: every rank writes the shared-memory names it maps to
argv[1].R, then rank 1 leaves with status 3 (rank 0 waits in a collective for it, as a server rank
would, and is ended by the launcher)."""

import sys
from pathlib import Path

from enkflow.parallel import get_comm, leave
from enkflow.parallel.leave import mapped_shm_names

comm = get_comm()
comm.barrier()
Path(f"{sys.argv[1]}.{comm.rank}").write_text("\n".join(str(p) for p in mapped_shm_names()))
comm.barrier()
if comm.rank == 1:
    leave(3)
comm.barrier()  # never completes: rank 1 is gone
