"""The demo study (tiny synthetic land problem, LETKF) run offline by the Python model and online by a
native runner, and the bitwise comparison of the two; shared by the tests of tests/native."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.apps.demo import run_demo
from enkflow.experiment.demo_problem import DemoSettings, prepare
from enkflow.shm_names import shm_dir

MEMBERS = 8
CYCLES = 3
FORCING_SCRIPT = Path(__file__).resolve().parents[2] / "native" / "examples" / "demo_forcing.py"


def offline_reference(directory: Path) -> Path:
    """The offline demo (the Python model through restart files); returns its directory."""
    run_demo(directory, DemoSettings(members=MEMBERS, cycles=CYCLES, mode="offline"), say=lambda _m: None)
    return directory


def make_forcing(restart: Path, out: Path) -> Path:
    subprocess.run([sys.executable, str(FORCING_SCRIPT), str(restart), str(out)], check=True)
    return out


@dataclass
class Study:
    directory: Path
    toml: Path
    rc: int = -1
    log: str = ""

    @property
    def run_dir(self) -> Path:
        return self.directory / "run"

    def events(self) -> list[dict]:
        path = self.run_dir / "events.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def segments_left(self) -> list[str]:
        """The shared memory segments of this study's servers (every incarnation) still named in the segment
        directory: none once the study is over."""
        pids = {str(e["pid"]) for e in self.events() if e.get("event") == "online_start"}
        return sorted(p.name for p in shm_dir().glob("enkflow-online-*") if p.name.split("-")[2] in pids)

    def shm_ranks(self) -> list[int]:
        """Per runner process (log), the server ranks it exchanged with through shared memory, as it said."""
        logs = sorted((self.run_dir / "online" / "logs").glob("runner-*.log"))
        return [int(n) for p in logs for n in re.findall(r"shared memory with (\d+) server rank", p.read_text())]

    def runner_logs(self) -> str:
        logs = sorted((self.run_dir / "online" / "logs").glob("runner-*.log"))
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in logs)


def online_study(directory: Path, runner: str, *, runners: int = 2, online: str = "") -> Study:
    """The demo prepared for online mode with ``runner`` as the ``[online] runner`` command (placeholders
    as in docs/online.md) and extra ``[online]`` lines ``online``."""
    toml = prepare(directory, DemoSettings(members=MEMBERS, cycles=CYCLES, mode="online", runners=runners),
                   lambda _m: None)
    text = toml.read_text()
    head = text[:text.index("\n[online]")]
    toml.write_text(head + f"\n[online]\nrunner = {json.dumps(runner)}\nrunners = {runners}\n{online}")
    return Study(directory, toml)


def run_study(study: Study, *, env: dict[str, str] | None = None, timeout: float = 120.0) -> Study:
    """``enkflow run`` the study to its end (in its own session, so that a test can signal runners)."""
    env = dict(os.environ if env is None else env)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    proc = subprocess.run([sys.executable, "-m", "enkflow", "run", str(study.toml)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=study.directory, start_new_session=True)
    study.rc, study.log = proc.returncode, proc.stdout + proc.stderr
    return study


def start_study(study: Study, *, env: dict[str, str] | None = None) -> subprocess.Popen:
    env = dict(os.environ if env is None else env)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return subprocess.Popen([sys.executable, "-m", "enkflow", "run", str(study.toml)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=study.directory, start_new_session=True)


def _arrays(path: Path) -> dict[str, bytes]:
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_mask(False)
        return {name: np.ascontiguousarray(v[...]).tobytes() for name, v in ds.variables.items()}


def outputs(directory: Path, run_dir: Path) -> dict[str, dict[str, bytes]]:
    """Every variable's bytes of the final member restarts and of every cycle's analysis mean and spread."""
    out = {}
    for m in range(1, MEMBERS + 1):
        out[f"member_{m:04d}.nc"] = _arrays(directory / "members" / f"member_{m:04d}.nc")
    for k in range(1, CYCLES + 1):
        for stat in ("mean", "spread"):
            out[f"cycle {k} analysis_{stat}.nc"] = _arrays(run_dir / "cycles" / f"{k:04d}" / f"analysis_{stat}.nc")
    return out


def differences(reference: dict[str, dict[str, bytes]], got: dict[str, dict[str, bytes]]) -> list[str]:
    """The files and variables that are not bitwise equal."""
    bad = []
    for f, variables in reference.items():
        for name, data in variables.items():
            if got.get(f, {}).get(name) != data:
                bad.append(f"{f}:{name}")
    return bad
