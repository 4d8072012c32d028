"""The online server's ranks take the observations distributed by locality as the offline analysis does:
the demo study (LETKF, adaptive inflation, quality control) served by 3 ranks gives, with the default
``[analysis] observations`` and with ``"replicated"``, the same members and cycle files (analysis mean
and spread, statistics, obs_diag.nc, inflation field) bit for bit. ``ENKFLOW_ONLINE_LAYOUT_RANKS=1,2,3,8``
runs it at each of those rank counts (issue 23's acceptance; the suite runs 3 only, for its time)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from enkflow.experiment.demo_problem import DemoSettings, prepare

SETTINGS = DemoSettings(members=4, cycles=2, mode="online", runners=2, adaptive="miyoshi2011")
RANKS = [int(r) for r in os.environ.get("ENKFLOW_ONLINE_LAYOUT_RANKS", "3").split(",")]
QC = "qc = { gross_sigma = 2.0, buddy_radius = 1200.0, buddy_sigma = 2.0 }\n"


def _study(d: Path, layout: str | None, env: dict, ranks: int = 3) -> Path:
    """The demo study in ``d`` with ``ranks`` server ranks and ``[analysis] observations = layout`` (None: the
    default), run to its end; its directory."""
    toml = prepare(d, SETTINGS, lambda _m: None)
    text = toml.read_text().replace('[observations]\nfile = "obs/obs_{cycle:04d}.nc"\n',
                                    '[observations]\nfile = "obs/obs_{cycle:04d}.nc"\n' + QC)
    if layout is not None:
        text = text.replace("[analysis]\n", f'[analysis]\nobservations = "{layout}"\n')
    toml.write_text(text + f"ranks = {ranks}\n")  # [online] is the file's last section
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
@pytest.mark.parametrize("ranks", RANKS)
def test_server_ranks_take_the_observations_distributed_bitwise(tmp_path, mpiexec, subprocess_env, ranks):
    rep = _files(_study(tmp_path / "replicated", "replicated", subprocess_env, ranks))
    dis = _files(_study(tmp_path / "distributed", None, subprocess_env, ranks))
    assert any(k.endswith("obs_diag.nc") for k in rep) and any("inflation" in k for k in rep), sorted(rep)
    assert rep.keys() == dis.keys()
    bad = [f"{f}:{v}" for f in rep for v in rep[f].keys() | dis[f].keys() if rep[f].get(v) != dis[f].get(v)]
    assert not bad, bad
    layouts = {e["cycle"]: e["obs_distributed"] for e in _analyses(tmp_path / "distributed")}
    assert layouts == {1: 1.0, 2: 1.0}, layouts
