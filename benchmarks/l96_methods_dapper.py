"""DAPPER's side of ``benchmarks/l96_methods.py``: one Lorenz-96 twin experiment, run by the python of
the DAPPER virtual environment (DAPPER 1.7.1), never by enkflow's. It does not import enkflow.

    DAPPER_VENV/bin/python benchmarks/l96_methods_dapper.py '{"method": "SL_EAKF", "args": [],
        "kwargs": {"N": 7, "infl": 1.07, "loc_rad": 6}, "burn_in": 400, "cycles": 10000, "seed": 0}'

prints one JSON line: ``rmse_a`` (time mean after the burn-in of the analysis RMSE over the 40
variables), ``spread_a`` (time mean of sqrt(mean ensemble variance)), ``seconds`` (the assimilation,
burn-in included).

The HMM is ``dapper.mods.Lorenz96.sakov2008.HMM`` (dt = 0.05, every variable observed every step,
R = I, no model noise, state batches of 2 points for the local methods) with the set-up of
``enkflow.apps.l96.run`` instead of DAPPER's defaults where they differ:

- length: ``burn_in + cycles`` analyses; the scores average the last ``cycles`` of them (DAPPER's
  ``Ko`` is the index of the last observation, and it scores the analyses at times > ``BurnIn``);
- truth: 8 + N(0, 0.01^2) per variable, integrated 2000 steps (``enkflow.models.lorenz96.spin_up``),
  where DAPPER starts near its ``x0`` with variance 0.001;
- initial ensemble: the truth at the start plus N(0, 1) per member and variable (enkflow's), where
  DAPPER draws the ensemble from its ``X0`` (variance 0.001 around ``x0``).

The draws come from DAPPER's generator seeded with ``seed + 1`` (DAPPER refuses 0): the same laws as
enkflow's, not the same numbers.

DAPPER 1.7.1's ``LNETF`` calls the HMM's localizer with the time as a third argument, which the
localizers of 1.7.1 no longer take (a TypeError at the first analysis); for it the localizer is wrapped
to drop the time (this HMM's localization does not depend on it).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass

DT = 0.05  # model time units per step and per observation
SPIN_UP_STEPS = 2000  # enkflow.models.lorenz96.spin_up
SPIN_UP_STD = 0.01  # of the truth's start around the forcing 8
FORCING = 8.0
INITIAL_STD = 1.0  # of the initial members around the truth (enkflow.apps.l96.run)


@dataclass(frozen=True)
class Request:
    """One DAPPER experiment: ``getattr(dapper.da_methods, method)(*args, **kwargs)`` on the HMM."""

    method: str
    args: tuple[str, ...]
    kwargs: dict
    burn_in: int  # analyses not scored
    cycles: int  # analyses scored after the burn-in
    seed: int

    @property
    def last_obs(self) -> int:
        """DAPPER's ``Ko``: the index of the last of ``burn_in + cycles`` observations."""
        return self.burn_in + self.cycles - 1

    @property
    def burn_in_time(self) -> float:
        """DAPPER's ``BurnIn``: observation ``ko`` is at time (ko + 1) * dt and scored when later than
        this, i.e. ``ko >= burn_in``; half a step away from both so rounding cannot move it."""
        return (self.burn_in + 0.5) * DT


def parse_request(text: str) -> Request:
    """The :class:`Request` in the JSON ``text``; a missing or wrong key is a ValueError naming it."""
    raw = json.loads(text)
    keys = {"method", "args", "kwargs", "burn_in", "cycles", "seed"}
    if not isinstance(raw, dict) or set(raw) != keys:
        raise ValueError(f"request: expected the keys {sorted(keys)}, got {raw!r}")
    for key in ("burn_in", "cycles", "seed"):
        if not isinstance(raw[key], int) or raw[key] < (1 if key == "cycles" else 0):
            raise ValueError(f"request: {key} must be an integer >= {1 if key == 'cycles' else 0}, got {raw[key]!r}")
    if not isinstance(raw["kwargs"], dict) or not isinstance(raw["args"], list):
        raise ValueError(f"request: args must be a list and kwargs an object, got {raw['args']!r}, {raw['kwargs']!r}")
    return Request(str(raw["method"]), tuple(raw["args"]), raw["kwargs"], raw["burn_in"], raw["cycles"], raw["seed"])


def _localizer_ignoring_time(localizer):
    """``localizer(radius, direction, tag)`` callable as LNETF calls it, ``(radius, direction, t, tag)``."""

    def localization_now(radius, direction, t, tag=None):
        return localizer(radius, direction, tag)

    return localization_now


def run(req: Request) -> dict:
    """Simulate the truth and observations, assimilate them with the requested method, score."""
    import dapper.da_methods as da
    import dapper.mods as modelling
    import dapper.tools.progressbar as progressbar
    import numpy as np
    from dapper.mods.Lorenz96 import step
    from dapper.mods.Lorenz96.sakov2008 import HMM as SAKOV2008
    from dapper.tools.seeding import set_seed

    progressbar.disable_progbar = True
    rng = set_seed(req.seed + 1)
    x = FORCING + SPIN_UP_STD * rng.standard_normal(SAKOV2008.Nx)
    for _ in range(SPIN_UP_STEPS):
        x = step(x, np.nan, DT)
    hmm = SAKOV2008.copy()
    hmm.tseq = modelling.Chronology(DT, dko=1, Ko=req.last_obs, BurnIn=req.burn_in_time)
    hmm.X0 = modelling.GaussRV(mu=x, C=0)  # the truth starts at the spun-up state itself
    xx, yy = hmm.simulate()
    hmm.X0 = modelling.GaussRV(mu=xx[0], C=INITIAL_STD**2)
    if req.method == "LNETF":
        hmm.Obs.Op1.localizer = _localizer_ignoring_time(hmm.Obs.Op1.localizer)
    xp = getattr(da, req.method)(*req.args, **req.kwargs)
    t0 = time.perf_counter()
    xp.assimilate(hmm, xx, yy)
    seconds = time.perf_counter() - t0
    xp.stats.average_in_time()
    return {"rmse_a": float(xp.avrgs.err.rms.a.val), "spread_a": float(xp.avrgs.spread.rms.a.val), "seconds": seconds}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: l96_methods_dapper.py REQUEST_JSON", file=sys.stderr)
        return 2
    print(json.dumps(run(parse_request(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
