"""The observation-operator registry: an operator defined here, registered at run time, reads an
observation file, locates its observations on the state and gives the analysis its H."""

from __future__ import annotations

from pathlib import Path

import netCDF4
import numpy as np
import pytest
import scipy.sparse as sp

from enkflow.config import Metric, validate
from enkflow.errors import ConfigError, FileFormatError
from enkflow.obs import registry
from enkflow.obs.config import ObsSettingsConfig
from enkflow.obs.fileformat import STATE_INDEX, ObsFile
from enkflow.obs.locating import Location, ObsOperator, Target
from enkflow.obs.obsfile import ObsSettings, load_for_state
from enkflow.obs.operators import LinearObsOperator
from enkflow.obs.reader import ObsPart, Source, first, read_obs_file
from enkflow.obs.space import FileObservations
from enkflow.parallel import SerialComm
from enkflow.state import StateLayout


class NeighbourMean:
    """H x = (x[k] + x[k + 1]) / 2 for the file's ``state_index`` k: an observation between two rows."""

    name = "neighbour_mean"

    def read(self, source: Source, layout: StateLayout, metric: Metric | None) -> ObsFile:
        return read_obs_file(source.given, n_state=layout.n_rows, cycle=source.cycle, coord_vars=())

    def locate(self, of: ObsFile, target: Target) -> Location:
        k = of.state_index
        assert k is not None
        n_rows = target.layout.n_rows
        if k.size and k.max() >= n_rows - 1:
            i = first(k >= n_rows - 1)
            raise target.source.fail(STATE_INDEX, f"observation {i} has no row after {k[i]}")
        rows = np.repeat(np.arange(k.size), 2)
        cols = np.column_stack([k, k + 1]).ravel()
        H = sp.csr_matrix((np.full(cols.size, 0.5), (rows, cols)), shape=(k.size, n_rows))
        coords = 0.5 * (target.layout.coords[k] + target.layout.coords[k + 1])
        return Location(coords, lonlat=False, operator=LinearObsOperator(H))


@pytest.fixture
def neighbour_mean(monkeypatch: pytest.MonkeyPatch) -> NeighbourMean:
    """NeighbourMean registered for one test (the table is restored afterwards)."""
    monkeypatch.setattr(registry, "OPERATORS", dict(registry.OPERATORS))
    op = NeighbourMean()
    registry.register(op)
    return op


def _files(tmp_path: Path, state_index: list[int]) -> tuple[StateLayout, Path]:
    with netCDF4.Dataset(tmp_path / "grid.nc", "w") as ds:
        ds.createDimension("x", 10)
        ds.createVariable("h", "f8", ("x",))[:] = 0.0
    k = np.asarray(state_index)
    with netCDF4.Dataset(tmp_path / "obs.nc", "w") as ds:
        ds.createDimension("obs", k.size)
        ds.createVariable("value", "f8", ("obs",))[:] = np.arange(k.size, dtype=float)
        ds.createVariable("error_std", "f8", ("obs",))[:] = 0.5
        ds.createVariable("state_index", "i8", ("obs",))[:] = k
    return StateLayout.from_file(tmp_path / "grid.nc", ["h"]), tmp_path / "obs.nc"


def test_a_registered_operator_reads_locates_and_applies(tmp_path: Path, neighbour_mean: NeighbourMean) -> None:
    assert isinstance(neighbour_mean, ObsOperator)
    layout, path = _files(tmp_path, [0, 3, 8])
    settings = ObsSettings(ObsSettingsConfig(interpolation="neighbour_mean"))
    of = load_for_state(path, layout, Metric.CARTESIAN, cycle=1, settings=settings)
    np.testing.assert_array_equal(of.obs.coords[:, 0], [0.5, 3.5, 8.5])
    np.testing.assert_array_equal(of.obs.error_var, np.full(3, 0.25))
    assert of.state_index is None and of.operator is not None
    X = np.asfortranarray(np.arange(20.0).reshape(10, 2))
    HX = FileObservations(of, layout.n_rows, settings=settings).apply(1, X, 0, SerialComm())
    np.testing.assert_array_equal(HX, 0.5 * (X[[0, 3, 8]] + X[[1, 4, 9]]))


def test_a_registered_operator_reports_bad_input_naming_the_file(tmp_path: Path, neighbour_mean: NeighbourMean) -> None:
    layout, path = _files(tmp_path, [0, 9])
    settings = ObsSettings(ObsSettingsConfig(interpolation="neighbour_mean"))
    with pytest.raises(FileFormatError, match="observation 1 has no row after 9") as ei:
        load_for_state(path, layout, Metric.CARTESIAN, cycle=4, settings=settings)
    assert ei.value.path == str(path) and ei.value.variable == STATE_INDEX and "cycle 4" in str(ei.value)
    # NeighbourMean reads the whole file: asked for a part, that is an error naming the operator.
    with pytest.raises(ConfigError, match=r"'neighbour_mean' read 2 observations .* \[0, 1\) were asked for") as ce:
        load_for_state(path, layout, Metric.CARTESIAN, cycle=4, settings=settings, part=ObsPart(0, 1))
    assert ce.value.key == "observations.interpolation"


def test_the_configuration_accepts_registered_operators_only(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="Input should be 'index', 'nearest' or 'bilinear'") as ei:
        validate(ObsSettingsConfig, {"interpolation": "neighbour_mean"}, prefix="observations")
    assert ei.value.key == "observations.interpolation"
    monkeypatch.setattr(registry, "OPERATORS", dict(registry.OPERATORS))
    registry.register(NeighbourMean())
    assert validate(ObsSettingsConfig, {"interpolation": "neighbour_mean"}).interpolation == "neighbour_mean"
    with pytest.raises(ConfigError, match="Input should be 'index', 'nearest', 'bilinear' or 'neighbour_mean'"):
        validate(ObsSettingsConfig, {"interpolation": "linear"})
    with pytest.raises(ConfigError, match="'neighbour_mean' is already registered"):
        registry.register(NeighbourMean())


def test_every_built_in_operator_loads() -> None:
    for name in registry.operator_names():
        assert registry.get_operator(name).name == name
