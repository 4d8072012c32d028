"""N-to-M with the C library: one runner of 3 ranks (threads of one process, each its own runner
handle, coordinated by enkflow_runner_set_comm callbacks; uneven slices, one empty) with a 2-rank
server (mpiexec), and 2 ranks with a 1-rank server; the same from Fortran (OpenMP threads as ranks,
enkflow_set_comm, sections of one array bound per rank). Every piece goes straight to the server rank
owning it, through the server rank's shared memory (or by TCP, when ENKFLOW_TRANSPORT=tcp forces it). The
final ensemble is bitwise the offline result of tests/online/test_online_bad_input.py's ring problem."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from enkflow.online import Server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "online"))
import test_online_bad_input as ring  # noqa: E402

HERE = Path(__file__).resolve().parent


def shm_ranks(stdout: str) -> list[int]:
    """Per runner rank (in its order), with how many server ranks it exchanged through shared memory."""
    said = dict(re.findall(r"rank (\d+): shared memory with (\d+) server rank", stdout))
    return [int(said[k]) for k in sorted(said, key=int)]


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_two_thread_ranks_with_a_one_rank_server(slices_runner: Path, transport: str) -> None:
    server = Server(ring.problem(), ring.server_config())
    errors: list[BaseException] = []
    t = threading.Thread(target=lambda: _run(server, errors), daemon=True)
    t.start()
    p = subprocess.run([str(slices_runner), server.address, ring.TOKEN, "2"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "ENKFLOW_TRANSPORT": transport})
    t.join(30)
    assert p.returncode == 0, p.stderr
    assert shm_ranks(p.stdout) == ([1, 1] if transport == "auto" else [0, 0]), p.stdout
    assert not t.is_alive() and not errors, errors
    np.testing.assert_array_equal(np.array(server.store.parts[0]), ring.offline_result())


def _run(server: Server, errors: list) -> None:
    try:
        server.run(ring.CYCLES)
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)


@pytest.mark.mpi
def test_three_thread_ranks_with_a_two_rank_server(slices_runner: Path, tmp_path: Path, mpiexec: str,
                                                   subprocess_env: dict[str, str]) -> None:
    server = subprocess.Popen([mpiexec, "-n", "2", sys.executable, str(HERE.parent / "online" / "bad_input_server.py"),
                               str(tmp_path)], env=subprocess_env)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "address").exists():
            assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        address = (tmp_path / "address").read_text().strip()
        p = subprocess.run([str(slices_runner), address, ring.TOKEN, "3"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert shm_ranks(p.stdout) == [2, 2, 2], p.stdout  # each piece straight into its server rank's slot
        assert server.wait(timeout=60) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    np.testing.assert_array_equal(np.load(tmp_path / "final.npy"), ring.offline_result())


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_fortran_thread_ranks_through_enkflow_set_comm(native_build, tmp_path: Path, transport: str) -> None:
    exe = tmp_path / "omp_slices_runner"
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "enkflow_runner_f"], env=native_build.env(),
                           capture_output=True, text=True, check=True).stdout.split()
    fc = subprocess.run(["gfortran", "-std=f2018", "-fopenmp", "-ffp-contract=off", str(HERE / "omp_slices_runner.f90"),
                         "-o", str(exe), *flags, f"-Wl,-rpath,{native_build.lib}"], capture_output=True, text=True,
                        cwd=tmp_path)  # the program's own module file lands there, not in the checkout
    assert fc.returncode == 0, fc.stderr
    server = Server(ring.problem(), ring.server_config())
    errors: list[BaseException] = []
    t = threading.Thread(target=lambda: _run(server, errors), daemon=True)
    t.start()
    p = subprocess.run([str(exe), server.address, ring.TOKEN, transport], capture_output=True, text=True, timeout=60,
                       env={**native_build.env(), "OMP_NUM_THREADS": "3"})  # tcp: enkflow_set_transport
    t.join(30)
    assert p.returncode == 0, p.stderr
    assert not t.is_alive() and not errors, errors
    assert shm_ranks(p.stdout) == ([1, 1, 1] if transport == "auto" else [0, 0, 0]), p.stdout
    np.testing.assert_array_equal(np.array(server.store.parts[0]), ring.offline_result())
