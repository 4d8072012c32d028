"""A model wrapper that misbehaves once per marked member, then runs the demo model.

usage: faulty_model.py MODE FLAGDIR MEMBERS RESTART LENGTH CYCLE MEMBER

On its first run for a member listed in MEMBERS (comma separated) it
* ``kill``: rewrites half of the restart in place with garbage and kills itself (SIGKILL);
* ``exit1``: the same, then exits 1;
* ``killworker``: runs the demo model to completion (the forecast is applied), then kills
  its worker with SIGKILL before the worker can record the member as done.
Every other run is the demo model (``enkflow model``), which replaces its restart atomically.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path


def main() -> int:
    mode, flagdir, members, restart, length, cycle, member = sys.argv[1:8]
    flag = Path(flagdir) / f"{mode}.c{cycle}.m{member}"
    first = member in members.split(",") and not flag.exists()
    demo = [sys.executable, "-m", "enkflow.cli.model", restart, "--length", length, "--cycle", cycle]
    if first:
        flag.touch()
        if mode in ("kill", "exit1"):
            size = os.path.getsize(restart)
            with open(restart, "r+b") as fh:  # a partial in-place write of the new state
                fh.seek(size // 2)
                fh.write(os.urandom(size - size // 2))
                fh.flush()
                os.fsync(fh.fileno())
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            return 1
        rc = subprocess.call(demo)
        os.kill(os.getppid(), signal.SIGKILL)
        return rc
    return subprocess.call(demo)


if __name__ == "__main__":
    sys.exit(main())
