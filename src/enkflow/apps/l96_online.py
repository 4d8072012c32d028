"""``enkflow l96 --online``: the Lorenz-96 twin experiment with members advanced by online runners.

The server (this process) holds the ensemble and the nature run; ``runners``
runner processes (``python -m enkflow.online.models l96``) step the members.
Same seeds, same analysis, same arithmetic as :func:`enkflow.apps.l96.run`,
hence the same scores bit for bit.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from enkflow.errors import EnkflowError
from enkflow.models import lorenz96 as l96
from enkflow.apps.l96 import L96Result, L96Setup, NatureRun, Scores, make_step
from enkflow.online.fields import Field
from enkflow.online.server import Problem, Server, ServerConfig
from enkflow.online.store import MemoryStore


class _OnlineNature(NatureRun):
    """The nature run advanced to the cycle asked for (the server's runners advance only the members)."""

    def __init__(self, truth: np.ndarray, rng: np.random.Generator, obs_std: float) -> None:
        super().__init__(truth, rng, obs_std)
        self.at = -1

    def to(self, cycle: int) -> "_OnlineNature":
        while self.at < cycle:
            self.advance()
            self.at += 1
        return self

    def observations(self, cycle: int):
        return super(_OnlineNature, self.to(cycle)).observations(cycle)


def run_online(s: L96Setup, runners: int = 2, progress: Callable[[int, int], None] | None = None,
               heartbeat_timeout_s: float = 30.0) -> L96Result:
    """Cycle burn-in + cycles analyses through the server; returns the time-mean scores after the burn-in."""
    nature_rng = np.random.default_rng([s.seed, 0])
    fil_rng = np.random.default_rng([s.seed, 1])
    n = l96.N_VARS
    nature = _OnlineNature(l96.spin_up(nature_rng), nature_rng, s.obs_std)
    E0 = nature.truth[:, None] + fil_rng.standard_normal((n, s.members))

    def initial(store: MemoryStore) -> None:
        store.parts[0][...] = E0

    scores = Scores(s.burn_in)
    total = s.burn_in + s.cycles
    step = make_step(s, nature.coords, lambda c: nature.to(c).truth, scores)
    problem = Problem((Field("x", "float64", (n,)),), s.members, initial, lambda c: 1, nature, step)
    with tempfile.TemporaryDirectory(prefix="enkflow-l96-") as tmp:
        token = Path(tmp) / "token"
        token.write_text(secrets.token_hex(32))
        os.chmod(token, 0o600)
        server = Server(problem, ServerConfig(token=token.read_text(), heartbeat_timeout_s=heartbeat_timeout_s),
                        progress=None)
        argv = [sys.executable, "-m", "enkflow.online.models", "l96", "--address", server.address, "--token-file", str(token)]
        procs = [subprocess.Popen(argv, stdin=subprocess.DEVNULL) for _ in range(runners)]
        try:
            t0 = time.perf_counter()
            server.run(list(range(total)))
            dt = time.perf_counter() - t0
        finally:
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        if any(p.returncode for p in procs):
            raise EnkflowError(f"runner exit statuses {[p.returncode for p in procs]}")
    if progress:
        progress(total, total)
    return scores.result(s.cycles, dt / total)
