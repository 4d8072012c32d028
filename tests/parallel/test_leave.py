"""The shared memory of a node's MPI ranks outlives no rank: its names go once every rank mapped it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from enkflow.parallel.leave import mapped_shm_names

HERE = Path(__file__).parent


def test_mapped_names_skip_deleted_and_other_files(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 rw-s 00000000 00:1a 11 /dev/shm/mpich_shm_1_0\n"
                    "7f01-7f02 rw-s 00000000 00:1a 12 /dev/shm/enkflow-ring-9 (deleted)\n"
                    "7f02-7f03 r-xp 00000000 08:01 13 /usr/lib/libc.so.6\n"
                    "7f03-7f04 rw-s 00000000 00:1a 11 /dev/shm/mpich_shm_1_0\n"
                    "7f04-7f05 rw-p 00000000 00:00 0\n"
                    "7f05-7f06 rw-s 00000000 00:1a 14 /dev/shm/sub/dir name\n")
    assert mapped_shm_names(maps) == [Path("/dev/shm/mpich_shm_1_0")]


@pytest.mark.mpi
def test_a_rank_killed_leaves_no_shared_memory_name_of_its_node(mpiexec, subprocess_env, tmp_path):
    """MPI_Finalize, which a killed rank never reaches, was the only thing that removed the name."""
    out = tmp_path / "names"
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, str(HERE / "mpi_leave.py"), str(out)],
                          env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, "rank 1 was killed"
    names = {Path(n) for r in (0, 1) for n in Path(f"{out}.{r}").read_text().split()}
    assert names, "MPI shares memory between the ranks of a node through /dev/shm"
    assert [n for n in names if n.exists()] == []
