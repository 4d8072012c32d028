"""Run under mpiexec by test_leave.py: every rank writes the /dev/shm files it maps (named or already
unlinked) to argv[1].R, then rank 1 is killed with SIGKILL (rank 0 waits in a collective for it, as a
server rank would, and is ended by the launcher)."""

import os
import signal
import sys
from pathlib import Path

from enkflow.parallel import get_comm

comm = get_comm()
maps = Path("/proc/self/maps").read_text().splitlines()
shm = {line.split(maxsplit=5)[5].removesuffix(" (deleted)") for line in maps if " /dev/shm/" in line}
Path(f"{sys.argv[1]}.{comm.rank}").write_text("\n".join(sorted(shm)))
comm.barrier()
if comm.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
comm.barrier()  # never completes: rank 1 is gone
