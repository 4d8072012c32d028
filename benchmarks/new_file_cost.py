"""Why a shadow-file update keeps the files it replaced (docs/io.md "Spares"): writing N files' bytes into
new files and renaming them over the old ones, against writing the same bytes in place.

    python benchmarks/new_file_cost.py [--dir DIR] [--members 40] [--mb 50] [--rounds 3]

In DIR (default: a temporary directory under the current one; use the file system of the member files), it
writes N files of MB megabytes, then times, each round after ``sync`` (no method pays for another's dirty
pages): ``in_place`` (``pwrite`` into the existing files), ``create`` (the same bytes into N new files),
``rename`` (those renamed over the old files, which frees the old ones) and ``reuse`` (the bytes into
files that exist but hold other content, then renamed over: what an update with spares does). Prints
one line per round and a JSON line of the medians (seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

import numpy as np


def _write(path: str, buf: np.ndarray, flags: int) -> None:
    fd = os.open(path, flags, 0o644)
    try:
        os.pwrite(fd, buf, 0)
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--members", type=int, default=40)
    ap.add_argument("--mb", type=float, default=50.0)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="new-file-cost-", dir=a.dir or os.getcwd())
    buf = np.random.default_rng(0).random(int(a.mb * 1e6) // 8)
    paths = [os.path.join(d, f"m{i:04d}") for i in range(a.members)]
    try:
        for p in paths:
            _write(p, buf, os.O_WRONLY | os.O_CREAT)
            _write(p + ".spare", buf, os.O_WRONLY | os.O_CREAT)

        def in_place() -> None:
            for p in paths:
                _write(p, buf, os.O_WRONLY)

        def create() -> None:
            for p in paths:
                _write(p + ".new", buf, os.O_WRONLY | os.O_CREAT | os.O_EXCL)

        def rename() -> None:
            for p in paths:
                os.rename(p + ".new", p)

        def reuse() -> None:
            for p in paths:
                _write(p + ".spare", buf, os.O_WRONLY)
            for p in paths:
                os.link(p, p + ".old")
                os.rename(p + ".spare", p)
                os.rename(p + ".old", p + ".spare")

        ways: list[tuple[str, Callable[[], None]]] = [("in_place", in_place), ("create", create), ("rename", rename),
                                                      ("reuse", reuse)]
        times: dict[str, list[float]] = {name: [] for name, _ in ways}
        for r in range(a.rounds):
            for name, fn in ways:
                subprocess.run(["sync"], check=True)
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()), flush=True)
        print(json.dumps({"members": a.members, "mb": a.mb} | {k: statistics.median(v) for k, v in times.items()}))
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
