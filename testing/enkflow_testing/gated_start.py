"""A runner process started ahead of its moment (run by path: ``python gated_start.py GATE``).

It pays its imports first, then waits for the file ``GATE`` to hold its command line as JSON
(``[python, "-m", MODULE, ARGS...]``) and runs that module in itself. The online fault harness
starts a joining runner this way, so that start-up (seconds of imports on a loaded machine) does
not decide whether the join falls inside the study; the process keeps its pid, so the runner's
name (``host:pid``) is the one the harness watches for.
"""

import json
import os
import runpy
import sys
import time

import enkflow.online.models  # noqa: F401 - the runner's imports, paid ahead


def main() -> None:
    gate = sys.argv[1]
    while not os.path.exists(gate):
        time.sleep(0.01)
    with open(gate) as f:
        argv = json.load(f)
    i = argv.index("-m")
    sys.argv = [argv[i + 1]] + argv[i + 2:]
    runpy.run_module(argv[i + 1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
