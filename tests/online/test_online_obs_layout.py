"""The online server's ranks take the observations distributed by locality as the offline analysis does:
the demo study (LETKF, adaptive inflation, quality control) served by 3 ranks gives, with the default
``[analysis] observations`` and with ``"replicated"``, the same members and cycle files (analysis mean
and spread, statistics, obs_diag.nc, inflation field) bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from enkflow.experiment.demo_problem import DemoSettings, prepare

SETTINGS = DemoSettings(members=4, cycles=2, mode="online", runners=2, adaptive="miyoshi2011")
QC = "qc = { gross_sigma = 2.0, buddy_radius = 1200.0, buddy_sigma = 2.0 }\n"


def _study(d: Path, layout: str | None, env: dict) -> Path:
    """The demo study in ``d`` with 3 server ranks and ``[analysis] observations = layout`` (None: the default), run
    to its end; its directory."""
    toml = prepare(d, SETTINGS, lambda _m: None)
    text = toml.read_text().replace('[observations]\nfile = "obs/obs_{cycle:04d}.nc"\n',
                                    '[observations]\nfile = "obs/obs_{cycle:04d}.nc"\n' + QC)
    if layout is not None:
        text = text.replace("[analysis]\n", f'[analysis]\nobservations = "{layout}"\n')
    toml.write_text(text + "ranks = 3\n")  # [online] is the file's last section
    proc = subprocess.run([sys.executable, "-m", "enkflow", "run", str(toml)], capture_output=True, text=True, env=env,
                          cwd=d, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return d


def _files(d: Path) -> dict[str, dict[str, tuple]]:
    """Every variable (dtype, dimensions, attributes, bytes) and global attribute but ``history`` of the final
    members and every cycle's files of the study in ``d``."""
    paths = sorted((d / "members").glob("member_*.nc")) + sorted((d / "run" / "cycles").glob("*/*.nc"))
    out = {}
    for p in paths:
        with netCDF4.Dataset(p) as ds:
            ds.set_auto_mask(False)
            # The mean and spread files name their template restart by its path (in the study's directory).
            glob = str({k: ds.getncattr(k) for k in ds.ncattrs() if k != "history"}).replace(str(d), "<study>")
            got: dict[str, tuple] = {"": (glob,)}
            for name, v in ds.variables.items():
                got[name] = (str(v.dtype), v.dimensions, str({k: v.getncattr(k) for k in v.ncattrs()}),
                             np.ascontiguousarray(v[...]).tobytes())
        out[str(p.relative_to(d))] = got
    return out


def _analyses(d: Path) -> list[dict]:
    events = [json.loads(line) for line in (d / "run" / "events.jsonl").read_text().splitlines()]
    return [e for e in events if "obs_distributed" in e]


@pytest.mark.mpi
def test_server_ranks_take_the_observations_distributed_bitwise(tmp_path, mpiexec, subprocess_env):
    rep = _files(_study(tmp_path / "replicated", "replicated", subprocess_env))
    dis = _files(_study(tmp_path / "distributed", None, subprocess_env))
    assert any(k.endswith("obs_diag.nc") for k in rep) and any("inflation" in k for k in rep), sorted(rep)
    assert rep.keys() == dis.keys()
    bad = [f"{f}:{v}" for f in rep for v in rep[f].keys() | dis[f].keys() if rep[f].get(v) != dis[f].get(v)]
    assert not bad, bad
    layouts = {e["cycle"]: e["obs_distributed"] for e in _analyses(tmp_path / "distributed")}
    assert layouts == {1: 1.0, 2: 1.0}, layouts
