"""Cost of a member's protected restart copy (enkflow.jobs.protect) against the restart's own I/O.

usage: python benchmarks/protect_cost.py [--dir DIR] [--mb 10 100 400]

For each size: the time to keep a restart aside as an in-place model needs it (reflink, else
copy_file_range, else a copy) and as a replacing model needs it (hard link), each the best of
three, side by side with the baseline a model pays anyway: reading the restart and writing a
new one (with fsync). Run it on the file system that holds the restarts (DIR).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from enkflow.jobs.protect import discard, protect


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=".", help="directory on the restarts' file system")
    ap.add_argument("--mb", type=int, nargs="+", default=[10, 100, 400])
    a = ap.parse_args()
    d = Path(tempfile.mkdtemp(dir=a.dir))
    try:
        print(f"{'MB':>5} {'mode':9} {'how':16} {'protect ms':>11} {'restart read+write ms':>22} {'ratio':>6}")
        for mb in a.mb:
            f = d / f"restart{mb}.nc"
            f.write_bytes(os.urandom(mb << 20))
            for mode in ("in-place", "rename"):
                prot = d / f".restart{mb}.orig"
                best, how = float("inf"), ""
                for _ in range(3):
                    t = time.perf_counter()
                    how = protect(f, prot, mode)
                    best = min(best, time.perf_counter() - t)
                    discard(prot)
                t = time.perf_counter()
                (d / "new").write_bytes(f.read_bytes())
                fd = os.open(d / "new", os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
                base = time.perf_counter() - t
                print(f"{mb:5d} {mode:9} {how:16} {best * 1e3:11.1f} {base * 1e3:22.1f} {best / base:6.2f}")
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
