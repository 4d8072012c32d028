"""Which process runs a pilot's step: the step's arguments end with the process's (an MPI launcher's
prefix aside), so a stopping pilot waits for the ranks SLURM ends after it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from enkflow.jobs.process import runs_a_step


def test_a_rank_of_a_step_prefixed_by_mpiexec_is_recognised_and_no_other() -> None:
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "/exp", "3"])
    try:
        while psutil.Process(rank.pid).cmdline()[-2:] != ["/exp", "3"]:  # until the child has exec'd
            time.sleep(0.01)
        step = ["mpiexec", "-n", "2", sys.executable, "-c", "import time; time.sleep(30)", "/exp", "3"]
        assert runs_a_step(rank.pid, [["true"], step])
        assert not runs_a_step(rank.pid, [step[:-1] + ["4"]])  # another cycle
        assert not runs_a_step(os.getpid(), [step])
    finally:
        rank.kill()
        rank.wait()
    assert not runs_a_step(rank.pid, [step])  # gone
