"""``enkflow l96 --online``: the Lorenz-96 twin experiment with members advanced by online runners.

The server (this process) holds the ensemble and the nature run; ``runners``
runner processes (``python -m enkflow.online.models l96``) step the members.
Same seeds, same analysis, same arithmetic as :func:`enkflow.models.l96_experiment.run`,
hence the same scores bit for bit.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from enkflow.analysis import Geometry, LocalDomains
from enkflow.config import Metric
from enkflow.errors import EnkflowError
from enkflow.experiment.cycling import LocalGeometry
from enkflow.models import lorenz96 as l96
from enkflow.models.l96_experiment import L96Result, L96Setup, NatureRun, make_filter
from enkflow.online.fields import Field
from enkflow.online.server import Problem, Server, ServerConfig
from enkflow.online.store import MemoryStore


class _OnlineNature(NatureRun):
    """The nature run advanced to the cycle asked for (the server's runners advance only the members)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.at = -1

    def to(self, cycle: int) -> "_OnlineNature":
        while self.at < cycle:
            self.advance()
            self.at += 1
        return self

    def observations(self, cycle: int):
        return super(_OnlineNature, self.to(cycle)).observations(cycle)


class _Scores:
    """An output sink summing the scores after the burn-in."""

    def __init__(self, burn_in: int):
        self.burn_in = burn_in
        self.sums = np.zeros(3)

    def write(self, cycle: int, Xa: np.ndarray, row_start: int, diag: dict[str, float]) -> None:
        if cycle >= self.burn_in:
            self.sums += (diag["rmse_analysis"], np.sqrt(np.mean(Xa.var(axis=1, ddof=1))), diag["rmse_prior"])


def run_online(s: L96Setup, runners: int = 2, progress=None, heartbeat_timeout_s: float = 30.0) -> L96Result:
    """Cycle burn-in + cycles analyses through the server; returns the time-mean scores after the burn-in."""
    nature_rng = np.random.default_rng([s.seed, 0])
    fil_rng = np.random.default_rng([s.seed, 1])
    n = l96.N_VARS
    nature = _OnlineNature(l96.spin_up(nature_rng), nature_rng, s.obs_std)
    E0 = nature.truth[:, None] + fil_rng.standard_normal((n, s.members))
    local = None
    if s.method.is_local:
        k = s.domain_size
        centres = (np.arange(n // k) * k + 0.5 * (k - 1)).astype(float)
        local = LocalGeometry(LocalDomains.from_groups(np.arange(n) // k, centres),
                              Geometry(Metric.PERIODIC, nature.coords, float(n)))

    def initial(store: MemoryStore) -> None:
        store.parts[0][...] = E0

    scores = _Scores(s.burn_in)
    total = s.burn_in + s.cycles
    flt = make_filter(s)
    carrier = None
    if getattr(flt, "adaptive", None) is not None:  # the adaptive inflation field, in the server's memory
        from enkflow.analysis.adaptive_inflation import FieldCarrier
        from enkflow.parallel import SerialComm

        carrier = FieldCarrier(flt.adaptive, n, SerialComm())
    problem = Problem((Field("x", "float64", (n,)),), s.members, initial, lambda c: 1, nature, flt,
                      local=lambda store: local, sink=scores, truth=lambda c: nature.to(c).truth, inflation=carrier)
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
    m = scores.sums / s.cycles
    return L96Result(float(m[0]), float(m[1]), float(m[2]), dt / total, s.cycles)
