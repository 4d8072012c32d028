"""A model command that injects one fault per (cycle, member) named in $FAULTS, on its first attempt only,
then behaves as the native model it wraps (exec). Run by ``python -m enkflow.online.intercept`` under the
shim: ``intercept_fault_model.py MODEL MARKERS ARGS...``. Faults (``$FAULTS`` = "cycle:member:kind,...")
  kill-model   read the state through the shim, then SIGKILL itself (the model dies mid-interception)
  kill-runner  read the state, then SIGKILL the wrapper (the runner process): the shim's death signal
               takes this process with it
  half-write   read the state, write only the first half of it with nc_put_vara and exit 0
  kill-mid-write  read the state, write a wrong first half of it, then SIGKILL itself before the rest
               (in place, that half is in the task's slot: it must never be accepted)
  hang         read the state, then sleep (the wrapper's --timeout kills it)
"""

import os
import signal
import sys
import time

model, markers, args = sys.argv[1], sys.argv[2], sys.argv[3:]
member, cycle = int(os.environ["ENKFLOW_MEMBER"]), int(os.environ["ENKFLOW_CYCLE"])
faults = dict((tuple(int(v) for v in f.split(":")[:2]), f.split(":")[2]) for f in os.environ.get("FAULTS", "").split(",") if f)
kind = faults.get((cycle, member))
marker = os.path.join(markers, f"c{cycle}m{member}")
if kind is None or os.path.exists(marker):
    os.execv(model, [model, *args])
open(marker, "w").close()

import netCDF4  # noqa: E402  (only a faulty attempt pays for it)

restart = args[0]
with netCDF4.Dataset(restart, "r") as ds:
    x = ds["soil_moisture"][:]  # through the shim: the member's state
if kind == "kill-model":
    os.kill(os.getpid(), signal.SIGKILL)
if kind == "kill-runner":
    with open(os.path.join(markers, "victim"), "w") as fh:
        fh.write(f"{os.getppid()} {os.getpid()}\n")
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(30)  # killed by the death signal long before
    sys.exit(3)
if kind == "half-write":
    with netCDF4.Dataset(restart, "a") as ds:
        ds["soil_moisture"][: x.size // 2] = x[: x.size // 2]
    sys.exit(0)
if kind == "kill-mid-write":
    with netCDF4.Dataset(restart, "a") as ds:
        ds["soil_moisture"][: x.shape[0] // 2] = -x[: x.shape[0] // 2]
        os.kill(os.getpid(), signal.SIGKILL)
if kind == "hang":
    time.sleep(120)
sys.exit(f"unknown fault {kind}")
