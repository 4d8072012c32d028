"""Seconds per cycle of one study run offline (restart files) and online (shared memory), with a real
model process per member, in one run (issue 27, acceptance 3).

    python benchmarks/online_vs_offline_cycle.py [--size large] [--members 16] [--cycles 3] [--workers 2]
        [--length 1] [--obs-fraction 0.00001] [--radius 100] [--transport shm] [--build DIR] [--dir DIR] [--keep]

The problem: the ``enkflow demo`` twin experiment (:mod:`enkflow.experiment.demo_problem`: synthetic land
problem, truth run, one observation file per cycle, LETKF) at ``--size`` (``large``: 8,598,360 land points,
a state of 68.8 MB per member, restart files of 344 MB with the grid's coordinates), ``--members`` members.
The model is the C demo model of ``native/examples`` (the demo model's dynamics, bit for bit), one process
per member at a time on each of ``--workers`` pilot workers or runners, in both modes:

* **offline**: ``enkflow run`` with ``mode = "offline"`` and ``[model] command`` = ``c_netcdf_model {restart}
  --forcing F --length {length} --cycle {cycle}`` (native/examples/c_netcdf: a plain netCDF program that reads
  its restart and forcing, advances and writes its restart in place), ``--workers`` dynamic pilot workers,
  the built-in LETKF as the analysis task. Everything at enkflow's defaults, the way a user runs a
  netCDF model offline: each forecast is a process that reads its restart and forcing and writes its
  restart (kept aside first, ``model.restart_write = "in-place"``, so a kill cannot corrupt it); the
  analysis reads every restart and writes it back through the write-ahead log. The member files were
  copied just before the run, so reads start from a warm page cache: the most favourable case for files.
* **online**: ``enkflow run`` with ``mode = "online"``, ``--workers`` runners ``enkflow_demo_c``
  (native/examples/c_api: the same model over libenkflow_runner, started once, reading its grid and
  forcing once), ``[online] transport = --transport`` (``shm``: states move through the server's shared
  memory; ``tcp``: over loopback), one server rank, the same LETKF in the server, forecasts checkpointed.

Both modes are crash-safe at their defaults, run the same analysis on the same forecasts (the analysis
means of every cycle are compared bit for bit: ``online_equals_offline``), with the same number of model
processes at a time. What online saves is what it exists for: the restart files read and written around
each forecast and by the analysis, and the model's start-up (its static input) every cycle.

Timed: the cycle's period in ``run/events.jsonl``, ``cycle_end(k) - cycle_end(k - 1)`` for k = 2..cycles
(the whole cycle: forecasts, analysis and whatever happens between cycles); the first cycle is left out
(start-up of pilots, runners and server, online the statelessness check). ``seconds_per_cycle_*`` is their
mean, ``ratio`` = offline / online; ``wall_s_*`` the whole ``enkflow run``; ``forecast_phase_s_*`` the part
of each timed cycle from its ``cycle_start`` to its last forecast done (the rest is the analysis and the
step to the next cycle). Prints progress; the last line is JSON.

Few observations (``--obs-fraction``: 86 at size large) and a short localization (``--radius``) keep the
analysis of 8.6 M points to about 10 s on 2 cores: the cycle is then mostly what the two modes do
differently, not the analysis they share (``forecast_phase_s_*`` shows the split). On 2 cores with the
defaults: about 5 minutes, 1.5 of them making the problem (``--size small`` checks the script in 30 s);
size large needs about 12 GB of disk under ``--dir`` (two copies of the members) and as much free memory
for the page cache, or the files' reads are no longer warm.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.experiment.config import load_experiment
from enkflow.experiment.demo_problem import DemoSettings, prepare
from enkflow.jobs.events import iter_events

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from native_restart_io import cmake_native  # noqa: E402  (this folder's module, after the path is set)


@dataclass(frozen=True)
class Models:
    """The two builds of the C demo model: over libenkflow_runner (online) and as a netCDF program (offline)."""

    runner: Path  # enkflow_demo_c
    netcdf: Path  # c_netcdf_model


def say(msg: str) -> None:
    print(msg, flush=True)


def build_models(out: Path, build_dir: Path | None) -> Models:
    build_dir = cmake_native(out, build_dir)
    return Models(runner=next(build_dir.rglob("enkflow_demo_c")), netcdf=next(build_dir.rglob("c_netcdf_model")))


def make_problem(d: Path, a: argparse.Namespace) -> Path:
    """The demo problem in ``d`` (members, truth, observations, ``forcing.nc``), its offline experiment.toml
    with the C model; returns that file."""
    s = DemoSettings(members=a.members, cycles=a.cycles, length=a.length, size=a.size, obs_fraction=a.obs_fraction,
                     radius=a.radius, workers=a.workers, mode="offline")
    toml = prepare(d, s, lambda m: say(f"  {m}"))
    subprocess.run([sys.executable, str(ROOT / "native" / "examples" / "demo_forcing.py"),
                    str(d / "members" / "member_0001.nc"), str(d / "forcing.nc")], check=True)
    return toml


def offline_toml(text: str, d: Path, models: Models) -> str:
    """The demo's experiment.toml ``text`` with the netCDF C model as ``[model] command``."""
    head, rest = text.split("\n[model]\n", 1)
    _, rest = rest.split("\n", 1)  # the demo's Python model command
    cmd = f"{models.netcdf} {{restart}} --forcing {d / 'forcing.nc'} --length {{length}} --cycle {{cycle}}"
    return f"{head}\n[model]\ncommand = {json.dumps(cmd)}\n{rest}"


def online_toml(text: str, d: Path, models: Models, a: argparse.Namespace) -> str:
    """``text`` (offline) in online mode, the C runner as ``[online] runner``."""
    if 'mode = "offline"' not in text:
        raise SystemExit('the demo\'s experiment.toml has no mode = "offline" line')
    runner = (f"{models.runner} --address {{address}} --token-file {{token_file}} --grid {{restart}} "
              f"--forcing {d / 'forcing.nc'} --length {{length}} --curve-key={{curve_key}}")
    # A forecast of the large grid takes seconds: the heartbeat timeout is no clock on the model.
    return text.replace('mode = "offline"', 'mode = "online"') + (
        f"\n[online]\nrunner = {json.dumps(runner)}\nrunners = {a.workers}\nmin_runners = {a.workers}\n"
        f'transport = "{a.transport}"\nheartbeat = 1.0\nheartbeat_timeout = 600.0\n')


@dataclass(frozen=True)
class Timeline:
    """POSIX seconds, by cycle, of a run's ``cycle_start`` and ``cycle_end`` events and of the last member's
    forecast done (offline ``task_end`` of a member, online ``task_done``)."""

    starts: dict[int, float]
    ends: dict[int, float]
    forecasts_done: dict[int, float]

    @classmethod
    def of(cls, events: Path) -> "Timeline":
        t = cls({}, {}, {})
        for e in iter_events(events):
            k = e.get("cycle")
            if not isinstance(k, int):
                continue
            if e.get("event") == "cycle_start":
                t.starts.setdefault(k, e["t"])
            elif e.get("event") == "cycle_end":
                t.ends.setdefault(k, e["t"])
            elif e.get("event") == "task_done" or (e.get("event") == "task_end" and e.get("member") is not None):
                t.forecasts_done[k] = max(t.forecasts_done.get(k, 0.0), e["t"])
        return t

    def periods(self, cycles: int) -> list[float]:
        """Seconds of cycles 2..cycles, each from the previous cycle's end to its own."""
        if sorted(self.ends) != list(range(1, cycles + 1)):
            raise SystemExit(f"cycle_end events of cycles {sorted(self.ends)}, expected 1..{cycles}")
        return [self.ends[k] - self.ends[k - 1] for k in range(2, cycles + 1)]

    def forecast_phases(self, cycles: int) -> list[float]:
        """Seconds of cycles 2..cycles from ``cycle_start`` to the last forecast done."""
        return [self.forecasts_done[k] - self.starts[k] for k in range(2, cycles + 1)]


def run_study(toml: Path, log: Path) -> tuple[float, Timeline]:
    """``enkflow run toml``: its wall seconds and its events' timeline."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        rc = subprocess.run([sys.executable, "-m", "enkflow", "run", str(toml)], env=env, stdout=fh,
                            stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"enkflow run {toml} failed (exit {rc}); see {log}")
    return wall, Timeline.of(load_experiment(toml).dir.events)


def mean_digests(toml: Path, cycles: int) -> list[str]:
    """sha256 of every cycle's analysis mean (soil_moisture's bytes)."""
    cfg = load_experiment(toml)
    out = []
    for k in range(1, cycles + 1):
        with netCDF4.Dataset(cfg.dir.cycle(k).mean) as ds:
            ds.set_auto_mask(False)
            out.append(hashlib.sha256(np.ascontiguousarray(ds["soil_moisture"][:]).tobytes()).hexdigest())
    return out


def measure(root: Path, a: argparse.Namespace, models: Models) -> dict:
    """The problem in ``root/problem``; offline there, online in a copy made before (same members)."""
    problem = root / "problem"
    t0 = time.perf_counter()
    say(f"making the {a.size} problem, {a.members} members, {a.cycles} cycles ...")
    toml = make_problem(problem, a)
    text = toml.read_text()
    online_dir = root / "online"
    shutil.copytree(problem, online_dir)
    with netCDF4.Dataset(problem / "members" / "member_0001.nc") as ds:
        res: dict = {"state_mb": ds["soil_moisture"].size * 8 / 1e6}  # float64 on the land points
    say(f"  problem ready ({time.perf_counter() - t0:.0f} s): a state of {res['state_mb']:.1f} MB per member")
    toml.write_text(offline_toml(text, problem, models))
    (online_dir / "experiment.toml").write_text(online_toml(offline_toml(text, online_dir, models), online_dir,
                                                            models, a))
    for mode, t in (("offline", toml), ("online", online_dir / "experiment.toml")):
        say(f"{mode}: enkflow run ...")
        wall, timeline = run_study(t, root / f"{mode}.log")
        per = timeline.periods(a.cycles)
        res[f"cycle_s_{mode}"] = per
        res[f"forecast_phase_s_{mode}"] = timeline.forecast_phases(a.cycles)
        res[f"seconds_per_cycle_{mode}"] = sum(per) / len(per)
        res[f"wall_s_{mode}"] = wall
        res[f"means_{mode}"] = mean_digests(t, a.cycles)
        say(f"  {mode}: {res[f'seconds_per_cycle_{mode}']:.2f} s per cycle (cycles 2..{a.cycles}: "
            f"{', '.join(f'{p:.2f}' for p in per)}; of which forecasts "
            f"{', '.join(f'{p:.2f}' for p in res[f'forecast_phase_s_{mode}'])}), {wall:.1f} s in all")
        shutil.rmtree(t.parent / "members", ignore_errors=True)  # disk: the next run has its own copy
    res["online_equals_offline"] = res.pop("means_offline") == res.pop("means_online")
    res["ratio"] = res["seconds_per_cycle_offline"] / res["seconds_per_cycle_online"]
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=["tiny", "small", "medium", "large"], default="large")
    p.add_argument("--members", type=int, default=16)
    p.add_argument("--cycles", type=int, default=3, help="cycles; the first is left out of the timing (>= 2)")
    p.add_argument("--workers", type=int, default=2, help="pilot workers (offline) and runners (online)")
    p.add_argument("--length", type=float, default=1.0, help="forecast length, hours (one model step each)")
    p.add_argument("--obs-fraction", type=float, default=1e-5, help="observed fraction of the land points")
    p.add_argument("--radius", type=float, default=100.0, help="LETKF localization half-width, km")
    p.add_argument("--transport", choices=["shm", "tcp", "auto"], default="shm", help="[online] transport")
    p.add_argument("--build", type=Path, default=None, help="an existing CMake build of native/ (default: build one)")
    p.add_argument("--dir", type=Path, default=None, help="working directory (default: a temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the working directory")
    a = p.parse_args(argv)
    if a.cycles < 2 or a.members < 2 or not 1 <= a.workers <= a.members:
        p.error("need --cycles >= 2, --members >= 2 and 1 <= --workers <= --members")
    if a.dir is not None:
        a.dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="enkflow-cycle-", dir=a.dir))
    try:
        say("building native/ ...")
        models = build_models(root, a.build)
        res = measure(root, a, models)
    finally:
        if a.keep:
            say(f"files kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    res.update(size=a.size, members=a.members, cycles=a.cycles, workers=a.workers,
               length_h=a.length, obs_fraction=a.obs_fraction, radius_km=a.radius, transport=a.transport,
               cpus=os.cpu_count())
    say(f"\nseconds per cycle, {a.members} members of {res['state_mb']:.1f} MB, {a.workers} model processes at a time:"
        f" offline {res['seconds_per_cycle_offline']:.2f}, online ({a.transport}) {res['seconds_per_cycle_online']:.2f};"
        f" offline / online {res['ratio']:.2f}; analyses equal: {res['online_equals_offline']}")
    print(json.dumps(res))
    return 0 if res["online_equals_offline"] else 1


if __name__ == "__main__":
    sys.exit(main())
