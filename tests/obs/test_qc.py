"""Quality control (issue 14, acceptance 3): planted 10-sigma gross errors are rejected, and the
analysis with QC is within 5% of the analysis without the bad observations; without QC it is
visibly worse. Also the buddy check, and the per-kind counts in the diagnostics.

The figures quoted in docs/analysis.md ("Quality control") are printed by
``python tests/obs/test_qc.py``.
"""

from __future__ import annotations

from pathlib import Path

import netCDF4
import numpy as np

from enkflow.analysis import LETKF, LocalDomains, Localization, ObsSet
from enkflow.analysis.qc import BUDDY, GROSS, QualityControl
from enkflow.config import LocalizationConfig, Metric
from enkflow.experiment.cycling import ArrayStore
from enkflow.experiment.decomposition import LocalGeometry
from enkflow.experiment.step import AnalysisStep, analyse
from enkflow.obs.config import ObsSettingsConfig
from enkflow.obs.obsfile import ObsSettings, load_for_state
from enkflow.obs.space import FileObservations
from enkflow.parallel import SerialComm
from enkflow.state import StateLayout

NX, N, SIGMA_O = 400, 20, 0.5
LOC = LocalizationConfig(radius=8.0, metric=Metric.PERIODIC, period=float(NX))


def _smooth(rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
    """(n, NX) smooth random fields on the ring (a few Fourier modes), standard deviation about ``scale``."""
    x = 2 * np.pi * np.arange(NX) / NX
    out = np.zeros((n, NX))
    for k in range(1, 12):
        a, b = rng.normal(size=(2, n, 1)) / np.sqrt(k)
        out += a * np.cos(k * x) + b * np.sin(k * x)
    return scale * out / out.std()


def problem(tmp_path: Path, seed: int = 0):
    """The ring state file, the truth, the forecast ensemble, and three observation files:
    clean, with 10-sigma gross errors planted at 5% of the observations, and the clean ones less those."""
    rng = np.random.default_rng(seed)
    with netCDF4.Dataset(tmp_path / "ring.nc", "w") as ds:
        ds.createDimension("x", NX)
        ds.createVariable("h", "f8", ("x",))[:] = 0.0
    layout = StateLayout.from_file(tmp_path / "ring.nc", ["h"])
    truth = _smooth(rng, 1, 2.0)[0]
    # Background error and spread about sigma_o: a 10 sigma_o error is about 7 sqrt(sigma_o^2 + sigma_b^2).
    X = np.asfortranarray((truth + _smooth(rng, 1, SIGMA_O)[0])[:, None] + _smooth(rng, N, SIGMA_O).T)
    xobs = np.arange(0.0, NX, 2.0)
    y = truth[xobs.astype(int)] + SIGMA_O * rng.normal(size=xobs.size)
    bad = np.sort(rng.choice(xobs.size, size=xobs.size // 20, replace=False))
    y_bad = y.copy()
    y_bad[bad] += 10 * SIGMA_O * rng.choice([-1.0, 1.0], size=bad.size)
    kinds = np.where(np.arange(xobs.size) % 2 == 0, 0, 1).astype(np.int32)

    def write(name: str, keep: np.ndarray, values: np.ndarray) -> Path:
        p = tmp_path / name
        with netCDF4.Dataset(p, "w") as ds:
            ds.createDimension("obs", int(keep.sum()))
            ds.createVariable("value", "f8", ("obs",))[:] = values[keep]
            ds.createVariable("error_std", "f8", ("obs",))[:] = SIGMA_O
            ds.createVariable("x", "f8", ("obs",))[:] = xobs[keep]
            k = ds.createVariable("kind", "i4", ("obs",))
            k.setncatts({"flag_values": np.array([0, 1], np.int32), "flag_meanings": "buoy ship"})
            k[:] = kinds[keep]
        return p

    everything = np.ones(xobs.size, bool)
    files = {"clean": write("clean.nc", ~np.isin(np.arange(xobs.size), bad), y),
             "bad": write("bad.nc", everything, y_bad)}
    return layout, truth, X, files, bad, kinds


def run(layout, truth, X, path: Path, qc: dict | None) -> dict:
    settings = ObsSettings(ObsSettingsConfig(interpolation="nearest", qc=qc or {}), LOC)
    obs = FileObservations(load_for_state(path, layout, Metric.PERIODIC, settings=settings), layout.n_rows,
                           settings=settings)
    store = ArrayStore(np.array(X, order="F", copy=True), comm=SerialComm())
    step = AnalysisStep(LETKF(localization=Localization.from_config(LOC)),
                        LocalGeometry(LocalDomains.by_location(layout.coords)), truth=lambda c: truth)
    _, diag = analyse(step, store, obs, 1)
    return diag.as_dict()


def figures(tmp_path: Path) -> dict[str, dict]:
    layout, truth, X, files, bad, kinds = problem(tmp_path)
    return {
        "without the bad observations": run(layout, truth, X, files["clean"], None),
        "with QC (gross_sigma = 4)": run(layout, truth, X, files["bad"], {"gross_sigma": 4.0}),
        "without QC": run(layout, truth, X, files["bad"], None),
        "_bad": {"n": float(bad.size), "ship": float(np.count_nonzero(kinds[bad] == 1))},
    }


def test_planted_gross_errors_are_rejected_and_the_analysis_is_that_of_the_clean_observations(tmp_path: Path) -> None:
    f = figures(tmp_path)
    clean, qc, raw = f["without the bad observations"], f["with QC (gross_sigma = 4)"], f["without QC"]
    assert clean["rmse_analysis"] < 0.6 * clean["rmse_prior"]  # the analysis works
    # Every planted error is rejected, and nothing else: the analysis is the clean one.
    assert qc["qc_rejected"] == qc["qc_gross"] == f["_bad"]["n"] and qc["qc_buddy"] == 0
    assert qc["qc_rejected:ship"] == f["_bad"]["ship"] and qc["qc_rejected:buoy"] == f["_bad"]["n"] - f["_bad"]["ship"]
    assert qc["n_obs"] == clean["n_obs"]
    assert abs(qc["rmse_analysis"] / clean["rmse_analysis"] - 1) < 0.05
    # Without QC the analysis is visibly worse.
    assert raw["rmse_analysis"] > 1.3 * clean["rmse_analysis"]
    assert "qc_rejected" not in raw


def test_buddy_check_rejects_a_departure_unlike_its_neighbours_and_spares_them() -> None:
    rng = np.random.default_rng(5)
    n = 60
    coords = np.arange(n, dtype=float)
    HX = rng.normal(size=(n, 10)) * 0.3
    y = HX.mean(axis=1) + 0.2 * rng.normal(size=n)
    s30 = np.sqrt(0.2**2 + HX[30].var(ddof=1))
    y[30] = HX[30].mean() + 4.2 * s30  # under a gross threshold of 5, far from its buddies
    obs = ObsSet(y, np.full(n, 0.2**2), coords, np.zeros(n, np.int32))
    gross_only = QualityControl(np.full(n, 5.0), metric=Metric.CARTESIAN).check(obs, HX)
    assert not gross_only.flags.any()
    res = QualityControl(np.full(n, 5.0), buddy_radius=3.5, buddy_sigma=3.0, metric=Metric.CARTESIAN).check(obs, HX)
    assert np.flatnonzero(res.flags) .tolist() == [30] and res.flags[30] == BUDDY
    # Buddies are of the same kind: alone in its kind, the observation has none and is kept.
    alone = ObsSet(y, obs.error_var, coords, np.where(np.arange(n) == 30, 1, 0).astype(np.int32))
    assert not QualityControl(None, buddy_radius=3.5, metric=Metric.CARTESIAN).check(alone, HX).flags.any()
    # The gross check alone, with a threshold per observation (inf: unchecked).
    k = np.full(n, np.inf)
    k[30] = 2.0
    assert np.flatnonzero(QualityControl(k).check(obs, HX).flags == GROSS).tolist() == [30]


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for name, diag in figures(Path(d)).items():
            if not name.startswith("_"):
                print(f"{name:30s} n_obs {diag['n_obs']:4.0f}  prior RMSE {diag['rmse_prior']:.4f}  "
                      f"analysis RMSE {diag['rmse_analysis']:.4f}  rejected {diag.get('qc_rejected', 0):.0f}")
