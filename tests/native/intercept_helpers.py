"""Experiments for the interception tests: the demo problem, with a plain netCDF model binary as the
offline model command or, through ``python -m enkflow.online.intercept``, as the online runner; and the
memory the shim serves a model from, without a server (:class:`ShimMemory`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.experiment.config import load_experiment
from enkflow.experiment.demo_problem import DemoSettings, prepare
from enkflow.online.fields import Field
from enkflow.online.intercept import Segment
from enkflow.online.shm_exchange import Extent


FORCING_SCRIPT = Path(__file__).resolve().parents[2] / "native" / "examples" / "demo_forcing.py"


def write_forcing(directory: Path, restart: Path) -> Path:
    """The demo model's forcing pattern ``pattern(lat, lon)``, which the native models read from a file."""
    path = directory / "forcing.nc"
    subprocess.run([sys.executable, str(FORCING_SCRIPT), str(restart), str(path)], check=True)
    return path


def make_problem(directory: Path, members: int = 4, cycles: int = 3) -> Path:
    """The demo problem (members, truth, observations, an offline experiment.toml) and its forcing file."""
    directory.mkdir(parents=True, exist_ok=True)
    toml = prepare(directory, DemoSettings(members=members, cycles=cycles, mode="offline"), say=lambda m: None)
    write_forcing(directory, directory / "members" / "member_0001.nc")
    return toml


def experiment(template: Path, directory: Path, model: Path, mode: str, shim: Path | None = None, *,
               runners: int = 2, steps: int | None = None, model_steps: int | None = 6, heartbeat_timeout: float = 10.0,
               max_failures: int = 3, online_model: str | None = None, wrapper_args: str = "",
               transport: str = "auto", min_runners: int = 1) -> Path:
    """A copy of the problem in ``template`` at ``directory`` whose model is the binary ``model``: offline
    as ``[model] command``, online as the intercepted runner (the command ``online_model``, default
    ``model``; ``transport`` the ``[online]`` key: shm, in place, or tcp). Returns the TOML path."""
    shutil.copytree(template, directory)
    toml = directory / "experiment.toml"
    forcing = directory / "forcing.nc"
    text = toml.read_text()
    text = re.sub(r'^command = .*$', f'command = "{model} {{restart}} --forcing {forcing} --length {{length}} --cycle {{cycle}}"',
                  text, count=1, flags=re.M)
    if mode == "online":
        text = text.replace('mode = "offline"', 'mode = "online"')
        check = (f"--steps {model_steps} " if model_steps else "") + (f"{wrapper_args} " if wrapper_args else "")
        text += (f'\n[online]\nrunner = "{sys.executable} -m enkflow.online.intercept --address {{address}} '
                 f'--token-file {{token_file}} --expdir {{expdir}} --shim {shim} {check}-- {online_model or model} {{{{restart}}}} '
                 f'--forcing {forcing} --length {{length}} --cycle {{{{cycle}}}}"\n'
                 f'runners = {runners}\nmin_runners = {min_runners}\ntransport = "{transport}"\nheartbeat = 0.5\n'
                 f"heartbeat_timeout = {heartbeat_timeout}\nmax_failures = {max_failures}\n"
                 + (f"steps = {steps}\n" if steps else ""))
    toml.write_text(text)
    return toml


def run(toml: Path) -> dict:
    cfg = load_experiment(toml)
    if cfg.experiment.mode == "online":
        from enkflow.online.launch import OnlineExperiment

        return OnlineExperiment(cfg).run()
    from enkflow.experiment.driver import Experiment

    return Experiment(cfg).run()


def var(path: Path, name: str = "soil_moisture") -> np.ndarray:
    with netCDF4.Dataset(path) as ds:
        return np.asarray(ds[name][:])


def analyses(directory: Path, members: int, cycles: int) -> dict[str, bytes]:
    """Every cycle's analysis mean and spread, and the final analysis ensemble (the members' restarts), as bytes."""
    out = {}
    for k in range(1, cycles + 1):
        for stat in ("mean", "spread"):
            f = f"run/cycles/{k:04d}/analysis_{stat}.nc"
            out[f] = var(directory / f).tobytes()
    for m in range(1, members + 1):
        f = f"members/member_{m:04d}.nc"
        out[f] = var(directory / f).tobytes()
    return out


class ShimMemory:
    """Where the shim finds a task's fields, without a server. ``how``:

    * ``"memfd"``: in the wrapper's memfd, as through TCP;
    * ``"in_place"``: the state in a "store" file and the forecast in a "slot" file of its own under
      ``directory`` (as the server's segments): each field in two extents, stored in reverse order at
      offsets that are no multiple of the page size;
    * ``"kept"``: in place, read and written in the slot (a state the server kept, read == write).
    """

    def __init__(self, fields: list[Field], how: str, directory: Path):
        self.seg = Segment(fields, in_place=how != "memfd")
        self.state: dict[str, list[np.ndarray]] = {}
        self.forecast_at: dict[str, list[np.ndarray]] = {}
        if how == "memfd":
            for f in fields:
                self.state[f.name] = self.forecast_at[f.name] = [self.seg.arrays[f.name]]
            return
        files = {"store": directory / "store.shm", "slot": directory / "slot.shm"}
        pieces = [(k, f, lo, hi) for k, f in enumerate(fields) for lo, hi in _halves(f.size)][::-1]
        offsets, at = [], 4096 + 8
        for _, f, lo, hi in pieces:
            offsets.append(at)
            at += (hi - lo) * f.itemsize + 8
        for path in files.values():
            path.write_bytes(b"\0" * at)
        read = files["slot" if how == "kept" else "store"]
        extents = []
        for (k, f, lo, hi), off in zip(pieces, offsets):
            extents.append(Extent(k, lo, hi, str(read), off, str(files["slot"]), off))
            self.state.setdefault(f.name, []).insert(0, np.memmap(read, f.dtype, "r+", off, (hi - lo,)))
            self.forecast_at.setdefault(f.name, []).insert(0, np.memmap(files["slot"], f.dtype, "r+", off, (hi - lo,)))
        self.seg.place(extents)

    def set_state(self, name: str, values: np.ndarray) -> None:
        at = 0
        for part in self.state[name]:
            part[:] = values[at:at + part.size]
            at += part.size

    def forecast(self, name: str) -> np.ndarray:
        return np.concatenate(self.forecast_at[name])

    def close(self) -> None:
        self.state.clear()
        self.forecast_at.clear()
        self.seg.close()


def _halves(n: int) -> list[tuple[int, int]]:
    return [(0, n)] if n < 2 else [(0, n // 2 + 1), (n // 2 + 1, n)]

