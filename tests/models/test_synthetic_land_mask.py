"""The land mask read row by row: the package's own answer, at a fraction of its memory."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from enkflow.errors import InputError
from enkflow.models import synthetic_land as sl
from enkflow.models.synthetic_land_mask import globe_land


@pytest.mark.parametrize("shape", [(72, 36), (360, 180), (7, 5), (1000, 999), (43200, 3)])
def test_streamed_mask_equals_globe_is_land(shape: tuple[int, int]) -> None:
    from global_land_mask import globe

    g = sl.LonLatGrid(*shape)
    ref = np.asarray(globe.is_land(g.lat[:, None], g.lon[None, :]), dtype=bool)
    np.testing.assert_array_equal(sl.land_mask(g), ref)


def test_unsorted_and_repeated_latitudes_and_the_poles() -> None:
    from global_land_mask import globe

    lat = np.array([10.0, -89.999, 90.0, 10.0, -90.0, 45.5])
    lon = np.array([179.999, -180.0, 0.0, 23.4])
    np.testing.assert_array_equal(globe_land(lat, lon), globe.is_land(lat[:, None], lon[None, :]))
    with pytest.raises(InputError, match="latitudes"):
        globe_land(np.array([91.0]), lon)


def _peak_rss_mib_of(argv: list[str]) -> float:
    """Peak RSS (MiB) of the command ``argv``, measured in a fresh intermediate process.

    RUSAGE_CHILDREN is the maximum over every child a process ever waited for, so
    asking pytest's own would also count earlier tests' children.
    """
    code = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code, *argv], check=True, capture_output=True, text=True).stdout
    kib = int(out.split()[-1])
    return kib / (1024 * 1024) if sys.platform == "darwin" else kib / 1024  # macOS reports bytes, Linux KiB


@pytest.mark.skipif(not hasattr(resource, "getrusage"), reason="needs resource.getrusage")
def test_synth_tiny_peak_memory_is_small(tmp_path: Path) -> None:
    # Loading the package's full mask made this ~1 GB; reading only the needed rows ~100 MB.
    peak = _peak_rss_mib_of([sys.executable, "-m", "enkflow", "synth", "--size", "tiny", "--members", "2",
                             "--out", str(tmp_path / "tiny")])
    assert peak < 400, f"enkflow synth --size tiny peaked at {peak:.0f} MiB"
