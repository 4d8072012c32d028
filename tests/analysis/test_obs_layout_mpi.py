"""Observations distributed by locality give the replicated layout's analysis bit for bit: at 1, 2, 3 and 8
ranks, on the tiny synthetic land problem (877 rows on a 5-degree grid, 4 members), with index, nearest and bilinear
observations of two kinds with different localization radii, gross-error and buddy checks that reject
some, H(x) from an operator stage, max_obs and adaptive inflation: the members, every variable and
attribute of obs_diag.nc and of the inflation field, and the diagnostics. In the same runs, bad input
(an observation outside the grid, one of a kind not configured) is refused by every rank, naming the
file and the observation's index in it, before anything is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from enkflow.analysis import ObsSet
from enkflow.obs.fileformat import ObsFile
from enkflow.obs.writer import write_obs_file

HERE = Path(__file__).parent
RANKS = (1, 2, 3, 8)
KINDS = ["wide", "narrow"]
# Two kinds: "wide" at the analysis' radius, "narrow" at its own, with its own gross-error threshold.
OBSERVATIONS = {"kinds": {"wide": {"code": 0}, "narrow": {"code": 1, "radius": 600.0, "qc_sigma": 2.5}},
                "qc": {"gross_sigma": 3.0, "buddy_radius": 1200.0, "buddy_sigma": 2.0}}
LOCALIZATION = {"radius": 1500.0, "convention": "cutoff", "metric": "sphere"}
# What a layout may change: where the observations lived, and the seconds.
LAYOUT_KEYS = {"obs_distributed", "rank_obs_held", "rank_obs_owned", "rank_obs_bytes", "rank_hx_bytes",
               "imbalance_cpu", "imbalance_wall"}


def _land(land: Path) -> tuple[np.ndarray, np.ndarray]:
    """The truth (n_rows,) and the state's (lon, lat) (n_rows, 2)."""
    with netCDF4.Dataset(land / "truth.nc") as ds:
        truth = np.asarray(ds["soil_moisture"][:], dtype=np.float64)
        lonlat = np.column_stack([np.asarray(ds["land_lon"][:]), np.asarray(ds["land_lat"][:])])
    return truth, lonlat


def _write(path: Path, values: np.ndarray, coords: np.ndarray, kinds: np.ndarray,
           state_index: np.ndarray | None, rng: np.random.Generator) -> Path:
    """Observations of error std 0.25 with 3 % outliers (the gross and buddy checks' rejects)."""
    std = 0.25
    y = values + std * rng.standard_normal(values.size)
    bad = rng.random(values.size) < 0.03
    y[bad] += rng.choice([-1.0, 1.0], bad.sum()) * rng.uniform(0.5, 3.0, bad.sum())
    obs = ObsSet(y, np.full(y.size, std**2), coords, kinds.astype(np.int32))
    write_obs_file(path, ObsFile(obs, state_index), kind_names=KINDS)
    return path


def _off_grid(lonlat: np.ndarray, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Points within a grid cell of the land points ``rows``, inside the grid's latitudes (every one has
    a land corner: bilinear finds one, nearest a row)."""
    at = lonlat[rows] + rng.uniform(-2.45, 2.45, (rows.size, 2))
    at[:, 0] = np.mod(at[:, 0] + 180.0, 360.0) - 180.0
    at[:, 1] = np.clip(at[:, 1], lonlat[:, 1].min(), lonlat[:, 1].max())
    return at


def _cases(land: Path, d: Path) -> dict[str, list[dict]]:
    truth, lonlat = _land(land)
    rng = np.random.default_rng(23)
    n = truth.size
    rows = np.sort(rng.choice(n, 6 * n // 10, replace=False))
    kinds = rng.integers(0, 2, rows.size)
    index = _write(d / "index.nc", truth[rows], lonlat[rows], kinds, rows, rng)
    at = _off_grid(lonlat, rows, rng)
    nearest = _write(d / "nearest.nc", truth[rows], at, kinds, None, rng)
    bilinear = _write(d / "bilinear.nc", truth[rows], at, kinds, None, rng)
    hx = []
    for m, p in enumerate(sorted(land.glob("member_*.nc"))):
        with netCDF4.Dataset(p) as ds:
            x = np.asarray(ds["soil_moisture"][:], dtype=np.float64)[rows]
        hx.append(str(d / f"hx_{m + 1:04d}.nc"))
        with netCDF4.Dataset(hx[-1], "w") as ds:
            ds.createDimension("obs", rows.size)
            # An operator that is not the selection: these H(x) must be the ones used.
            ds.createVariable("hx", "f8", ("obs",))[:] = x + 0.05 * np.sin(rows)

    def case(name: str, obs: Path, interpolation: str, *, hx: list[str] | None = None, balance: bool | None = None,
             localization: dict | None = None, inflation: dict | None = None) -> dict:
        analysis = {"method": "letkf", "localization": localization or LOCALIZATION}
        if inflation is not None:
            analysis["inflation"] = inflation
        return {"name": name, "obs": str(obs), "analysis": analysis, "hx": hx, "balance": balance,
                "observations": {**OBSERVATIONS, "interpolation": interpolation}}

    # Bad input, each in the last rank's share: an observation outside the grid, one of a kind not configured.
    at[-2, 1] = 89.0
    outside = _write(d / "outside.nc", truth[rows], at, kinds, None, rng)
    kinds[-1] = 2
    unknown = _write(d / "unknown_kind.nc", truth[rows], lonlat[rows], kinds, rows, rng)
    return {"cases": [case("index", index, "index"),
                      case("nearest", nearest, "nearest", localization={**LOCALIZATION, "max_obs": 12}),
                      case("bilinear", bilinear, "bilinear", inflation={"adaptive": "miyoshi2011"}),
                      case("hx", index, "index", hx=hx, balance=False)],
            "bad": [case("outside", outside, "bilinear"), case("unknown_kind", unknown, "index")]}


def _variables(path: Path) -> dict[str, tuple]:
    """Every variable's dtype, dimensions, attributes and bytes, and the global attributes but ``history``."""
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_mask(False)
        out: dict[str, tuple] = {"": ({k: ds.getncattr(k) for k in ds.ncattrs() if k != "history"},)}
        for name, v in ds.variables.items():
            a = np.asarray(v[...])
            attrs = {k: str(v.getncattr(k)) for k in v.ncattrs()}
            out[name] = (str(a.dtype), v.dimensions, attrs, a.tobytes())
    return {k: tuple(str(x) if isinstance(x, dict) else x for x in t) for k, t in out.items()}


def _same_files(a: Path, b: Path) -> list[str]:
    """The files of the cycle directories ``a`` and ``b`` and the variables where they differ."""
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    bad = []
    for name in names:
        va, vb = _variables(a / name), _variables(b / name)
        bad += [f"{name}:{k}" for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k)]
    return bad


def _same_layouts(out: Path, name: str, n: int) -> tuple[float, float, float]:
    """Check the case ``name`` of the ``n``-rank run in ``out``: both layouts' members, cycle files and
    diagnostics bit for bit; returns its n_obs, omb_rms, oma_rms."""
    rep, dis = out / f"{name}_replicated", out / f"{name}_distributed"
    what = (n, name)
    a, b = np.load(rep / "members.npy"), np.load(dis / "members.npy")
    assert a.tobytes() == b.tobytes(), (what, np.abs(a - b).max())
    assert not _same_files(rep / "c0", dis / "c0"), (what, _same_files(rep / "c0", dis / "c0"))
    da, db = (json.loads((p / "diag.json").read_text()) for p in (rep, dis))
    assert da.keys() == db.keys(), what
    differ = [k for k in da if k not in LAYOUT_KEYS and not k.endswith("_s") and da[k] != db[k]]
    assert not differ, (what, {k: (da[k], db[k]) for k in differ})
    # Each layout took its own path, and the checks rejected some of both kinds.
    assert da["obs_distributed"] == 0.0 and db["obs_distributed"] == 1.0, what
    assert db["qc_gross"] > 0 and db["qc_buddy"] > 0, (what, db)
    assert db["qc_rejected:wide"] > 0 and db["qc_rejected:narrow"] > 0, (what, db)
    assert sum(db["rank_obs_owned"]) == da["rank_obs_owned"][0], what  # each observation owned once
    if n > 1:
        assert max(db["rank_obs_held"]) < da["rank_obs_held"][0], (what, db["rank_obs_held"])
    return db["n_obs"], db["omb_rms"], db["oma_rms"]


def _refused(out: Path, case: dict, n: int) -> None:
    """The bad ``case`` of the ``n``-rank run: the rank that read the bad observation names the file and the
    observation's index in it; every other rank raises that error as a PeerError."""
    with netCDF4.Dataset(case["obs"]) as ds:
        n_obs = ds.dimensions["obs"].size
    bad = n_obs - 2 if case["name"] == "outside" else n_obs - 1
    q, r = divmod(n_obs, n)  # the equal shares of the file, the first ranks one more
    reader = next(k for k in range(n) if bad < (k + 1) * q + min(k + 1, r))
    said = json.loads((out / f"{case['name']}_errors.json").read_text())
    mine = said[reader]
    assert mine.startswith(f"FileFormatError: {case['obs']}, variable "), (n, mine)
    assert f"observation {bad} " in mine, (n, mine)
    assert ("is outside the domain" if case["name"] == "outside" else "is not a configured kind") in mine, mine
    message = mine.removeprefix("FileFormatError: ")
    assert said == [mine if k == reader else f"PeerError: rank {reader}: {message}" for k in range(n)], (n, said)


@pytest.mark.mpi
def test_distributed_observations_equal_the_replicated_bitwise(mpiexec, subprocess_env, synth, tmp_path):
    spec = _cases(synth, tmp_path)
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(spec))
    env = dict(subprocess_env, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), subprocess_env.get("PYTHONPATH")])))
    figures: dict[str, set] = {}
    for n in RANKS:
        out = tmp_path / f"r{n}"
        proc = subprocess.run([mpiexec, "-n", str(n), sys.executable, str(HERE / "mpi_obs_layout.py"), str(synth),
                               str(path), str(out)], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        for c in spec["cases"]:
            figures.setdefault(c["name"], set()).add(_same_layouts(out, c["name"], n))
        for c in spec["bad"]:
            _refused(out, c, n)
        for m in sorted(synth.glob("member_*.nc")):  # nothing was written
            assert (out / "bad" / m.name).read_bytes() == m.read_bytes(), (n, m.name)
    # The same figures at every rank count; the operator stage's H(x) were the ones used.
    assert all(len(v) == 1 for v in figures.values()), figures
    assert figures["hx"] != figures["index"]
