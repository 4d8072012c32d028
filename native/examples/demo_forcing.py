"""Write the demo model's forcing pattern for the native example models: ``python demo_forcing.py RESTART OUT.nc``.

The demo model (``enkflow.models.demo_model``) forces every land cell with ``a sin(omega t) f(i, j)``,
where ``f`` is the synthetic problem's truth pattern, computed by NumPy. NumPy's vectorised ``**3``
(SIMD on AVX-512 machines) is not the C library's ``pow``: a C or Fortran model computing ``f`` itself
would differ from the Python model in the last bit on some machines. So the native examples read ``f``
from this file, as a real model reads its static forcing: ``pattern(lat, lon)`` float64, on the grid of
RESTART (any restart of the problem: its ``lon``/``lat`` dimensions).
"""

from __future__ import annotations

import sys
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.fsutil import atomic_output
from enkflow.models.demo_model import _pattern


def write_forcing(restart: Path, out: Path) -> None:
    with netCDF4.Dataset(restart) as ds:
        n_x, n_y = len(ds.dimensions["lon"]), len(ds.dimensions["lat"])
    pattern = _pattern(n_x, n_y)
    with atomic_output(out) as tmp:
        with netCDF4.Dataset(tmp, "w") as ds:
            ds.createDimension("lat", n_y)
            ds.createDimension("lon", n_x)
            v = ds.createVariable("pattern", "f8", ("lat", "lon"))
            v.long_name = "the demo model's forcing pattern f(i, j) (enkflow.models.demo_model._pattern)"
            v[:] = np.ascontiguousarray(pattern, dtype=np.float64)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    write_forcing(Path(sys.argv[1]), Path(sys.argv[2]))
