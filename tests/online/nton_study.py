"""One N-to-M study (nton_server.py and nton_runner.py) for the tests: its processes, and the result."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def script(name: str, tmp: Path, *extra: str) -> list[str]:
    """The command of ``name`` (nton_server.py or nton_runner.py) for the study in ``tmp``."""
    return [sys.executable, str(HERE / name), str(tmp), *extra]


def logs(tmp: Path) -> str:
    return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(tmp.glob("*.log")))


def run_study(tmp: Path, env: dict, server: list[str], runners: list[list[str]]) -> dict[str, np.ndarray]:
    """Run the server command ``server`` and the runner commands in ``tmp`` (made here, with a token) to
    the end; the final ensemble of every field."""
    tmp.mkdir()
    (tmp / "token").write_text(secrets.token_hex(16))

    def start(argv: list[str], log: str) -> subprocess.Popen:
        with open(tmp / log, "wb") as out:
            return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)

    procs = [start(server, "server.log")] + [start(r, f"runner{i}.log") for i, r in enumerate(runners)]
    try:
        assert procs[0].wait(timeout=120) == 0, logs(tmp)
        for r in procs[1:]:
            assert r.wait(timeout=60) == 0, logs(tmp)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    with np.load(tmp / "out.npz") as z:
        return {k: z[k] for k in z.files}
