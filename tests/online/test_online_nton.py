"""N-to-M: MPI runners expose uneven slices of several fields (three dtypes, one carried); the server
ranks receive exactly the elements they own. The result is bitwise the one of 1 server rank and 1 runner rank;
the one runs over TCP, the other through shared memory (each runner rank writing straight into the owning
server rank's segments)."""

import numpy as np
import pytest
from nton_study import run_study, script


def _study(tmp, mpiexec: str, env: dict, server_ranks: int, runner_ranks: list[int]) -> dict:
    def cmd(name: str, n: int, *extra: str) -> list[str]:
        base = script(name, tmp, *extra)
        return [mpiexec, "-n", str(n), *base] if n > 1 else base

    # The server hands out members once every runner has joined, so that each takes part.
    return run_study(tmp, env, cmd("nton_server.py", server_ranks, str(len(runner_ranks))),
                     [cmd("nton_runner.py", n, str(i)) for i, n in enumerate(runner_ranks)])


@pytest.mark.mpi
def test_n_to_m_redistribution_is_exact(tmp_path, mpiexec, subprocess_env):
    ref = _study(tmp_path / "ref", mpiexec, subprocess_env | {"ENKFLOW_TRANSPORT": "tcp"}, 1, [1])
    got = _study(tmp_path / "nm", mpiexec, subprocess_env | {"ENKFLOW_TRANSPORT": "auto"}, 2, [3, 1])
    assert (tmp_path / "ref" / "runner0.log").read_text().count("in_place=False") == 1
    for i, n in enumerate([3, 1]):
        assert (tmp_path / "nm" / f"runner{i}.log").read_text().count("in_place=True") == n
    assert ref.keys() == got.keys() == {"a", "b", "h"}
    for k in ref:
        assert ref[k].dtype == got[k].dtype
        assert np.array_equal(ref[k], got[k]), k
    # The carried counter went through 3 cycles of 2 steps untouched by the analysis.
    assert np.array_equal(got["h"], np.arange(11)[:, None] * np.arange(1, 6)[None, :] + 6)
