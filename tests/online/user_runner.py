"""A runner as a researcher writes it from docs/online.md, *without* ``with Runner(...)``:
``python user_runner.py ADDRESS TOKEN_FILE RESTART CASE``.

CASE ``raise``: member 2 raises a FloatingPointError inside the loop (the process ends through the
uncaught exception); ``extra-field``: it also declares the restart's ``land_i``, which the experiment
does not carry ([online] carried); ``wrong-token``: it sends another token than the server's.
"""

import sys
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.online import Field, Runner

address, token_file, restart, case = sys.argv[1:5]
with netCDF4.Dataset(restart) as ds:
    n = ds.dimensions["land"].size
fields = [Field("soil_moisture", "float64", (n,))]
state = {"soil_moisture": np.zeros(n)}
if case == "extra-field":
    fields.append(Field("land_i", "int64", (n,), assimilated=False))
    state["land_i"] = np.zeros(n, dtype=np.int64)

token = Path(token_file).read_text().strip()
runner = Runner(address, "0" * len(token) if case == "wrong-token" else token)
runner.init(fields)
state, nsteps = runner.expose(state)
while nsteps:
    if case == "raise" and runner.member == 2:
        raise FloatingPointError(f"overflow in the tracer advection of member {runner.member}")
    state, nsteps = runner.expose(state)
runner.close()
