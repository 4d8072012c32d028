"""Throughput of the write-ahead log's record checksum (CRC-32 of every byte) against the copy
into the log that it follows.

usage: python benchmarks/wal_checksum.py [--mb 64] [--repeat 5]

Prints GB/s of a memory copy (np.copyto), of enkflow.io.wal.checksum on the same buffer, and of
LogSink's copy-then-checksum in 256 KiB pieces, best of --repeat, with the ratios to the copy.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from enkflow.io.wal import CRC_CHUNK, checksum


def best(fn, repeat: int) -> float:
    t = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    n = a.mb << 20
    src = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    dst = np.empty_like(src)

    def chunked() -> None:
        cs = 0
        for i in range(0, n, CRC_CHUNK):
            np.copyto(dst[i : i + CRC_CHUNK], src[i : i + CRC_CHUNK])
            cs = checksum(dst[i : i + CRC_CHUNK], cs)

    t_copy = best(lambda: np.copyto(dst, src), a.repeat)
    t_crc = best(lambda: checksum(dst), a.repeat)
    t_both = best(chunked, a.repeat)
    for name, t in (("copy", t_copy), ("crc32", t_crc), ("copy+crc32 (log append)", t_both)):
        print(f"{name:24s} {n / t / 1e9:7.2f} GB/s   {t / t_copy:5.2f}x the copy")


if __name__ == "__main__":
    main()
