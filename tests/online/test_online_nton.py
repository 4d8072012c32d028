"""N-to-M: MPI runners expose uneven slices of several fields (three dtypes, one carried); the server
ranks receive exactly the elements they own. The result is bitwise the one of 1 server rank and 1 runner rank."""

import secrets
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent


def _study(tmp: Path, mpiexec: str, env: dict, server_ranks: int, runner_ranks: list[int]) -> dict:
    tmp.mkdir()
    (tmp / "token").write_text(secrets.token_hex(16))

    def cmd(script: str, n: int, *extra: str) -> list[str]:
        base = [sys.executable, str(HERE / script), str(tmp), *extra]
        return [mpiexec, "-n", str(n), *base] if n > 1 else base

    def start(argv: list[str], log: str) -> subprocess.Popen:
        return subprocess.Popen(argv, env=env, stdout=open(tmp / log, "wb"), stderr=subprocess.STDOUT)

    def logs() -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(tmp.glob("*.log")))

    # The server hands out members once every runner has joined, so that each takes part.
    server = start(cmd("nton_server.py", server_ranks, str(len(runner_ranks))), "server.log")
    runners = [start(cmd("nton_runner.py", n, str(i)), f"runner{i}.log") for i, n in enumerate(runner_ranks)]
    assert server.wait(timeout=120) == 0, logs()
    for r in runners:
        assert r.wait(timeout=60) == 0, logs()
    with np.load(tmp / "out.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.mark.mpi
def test_n_to_m_redistribution_is_exact(tmp_path, mpiexec, subprocess_env):
    ref = _study(tmp_path / "ref", mpiexec, subprocess_env, 1, [1])
    got = _study(tmp_path / "nm", mpiexec, subprocess_env, 2, [3, 1])
    assert ref.keys() == got.keys() == {"a", "b", "h"}
    for k in ref:
        assert ref[k].dtype == got[k].dtype
        assert np.array_equal(ref[k], got[k]), k
    # The carried counter went through 3 cycles of 2 steps untouched by the analysis.
    assert np.array_equal(got["h"], np.arange(11)[:, None] * np.arange(1, 6)[None, :] + 6)
