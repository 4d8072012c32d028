"""Throughput of candidate checksums for the write-ahead log's records against the copy into the log
that each follows.

usage: python benchmarks/wal_checksum.py [--mb 256] [--repeat 5] [--chunks 65536 262144 1048576] [--json]

Every candidate checks every byte: zlib's CRC-32 (the log format before version 3), the hardware
CRC-32C of the ``google-crc32c`` and ``crc32c`` wheels, and XXH3-64/128 (``xxhash``), the latter
streamed (chained over pieces) as a record is. Candidates whose package is missing are skipped.

For each: GB/s over one buffer of --mb MB (out of cache: memory speed), one thread and two threads
(half the buffer each, to see which release the GIL); and the checksum fused with the copy into
the log in cache-sized pieces (``np.copyto`` of a piece, then its checksum while it is still in
cache, as :class:`enkflow.io.wal.LogSink` does on tmpfs) for each --chunks size. Best of --repeat, with
the ratio to a plain ``np.copyto`` of the same bytes. Also :mod:`enkflow.io.walformat`'s checksum itself
(the one chosen, XXH3-64: see docs/io.md).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from enkflow.io import walformat

Buf = np.ndarray


@dataclass(frozen=True)
class Candidate:
    """``whole(buf)`` checksums a buffer; ``pieces()`` returns ``(update(piece), digest())`` for chaining."""

    name: str
    whole: Callable[[Buf], object]
    pieces: Callable[[], tuple[Callable[[Buf], None], Callable[[], object]]]


def _chained(step: Callable[[Buf, int], int]) -> Callable[[], tuple[Callable[[Buf], None], Callable[[], object]]]:
    def make() -> tuple[Callable[[Buf], None], Callable[[], object]]:
        state = [0]

        def update(b: Buf) -> None:
            state[0] = step(b, state[0])

        return update, lambda: state[0]

    return make


class _Hasher(Protocol):
    def update(self, data: Buf) -> None: ...

    def intdigest(self) -> int: ...


def _streamed(factory: Callable[[], _Hasher]) -> Callable[[], tuple[Callable[[Buf], None], Callable[[], object]]]:
    def make() -> tuple[Callable[[Buf], None], Callable[[], object]]:
        h = factory()
        return h.update, h.intdigest

    return make


def _digest() -> tuple[Callable[[Buf], None], Callable[[], object]]:
    d = walformat.Digest()
    return d.update, lambda: d.value


def candidates() -> list[Candidate]:
    """Every candidate whose package imports."""
    out = [
        Candidate("zlib crc32", lambda b: zlib.crc32(b), _chained(lambda b, v: zlib.crc32(b, v))),
        Candidate("enkflow walformat (chosen)", walformat.checksum, _digest),
    ]
    try:
        import google_crc32c

        out.append(Candidate(f"google-crc32c ({google_crc32c.implementation})", lambda b: google_crc32c.value(b),
                             _chained(lambda b, v: google_crc32c.extend(v, b))))
    except ImportError:
        pass
    try:
        import crc32c

        out.append(Candidate("crc32c", lambda b: crc32c.crc32c(b), _chained(lambda b, v: crc32c.crc32c(b, v))))
    except ImportError:
        pass
    try:
        import xxhash

        out.append(Candidate("xxh3_64", lambda b: xxhash.xxh3_64_intdigest(b), _streamed(xxhash.xxh3_64)))
        out.append(Candidate("xxh3_128", lambda b: xxhash.xxh3_128_intdigest(b), _streamed(xxhash.xxh3_128)))
    except ImportError:
        pass
    return out


def best(fn: Callable[[], object], repeat: int) -> float:
    t = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def two_threads(fn: Callable[[Buf], object], buf: Buf) -> Callable[[], None]:
    half = buf.size // 2

    def run() -> None:
        ts = [threading.Thread(target=fn, args=(p,)) for p in (buf[:half], buf[half:])]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    return run


def fused(c: Candidate, src: Buf, dst: Buf, chunk: int) -> Callable[[], None]:
    def run() -> None:
        update, digest = c.pieces()
        for i in range(0, src.size, chunk):
            d = dst[i : i + chunk]
            np.copyto(d, src[i : i + chunk])
            update(d)
        digest()

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--chunks", type=int, nargs="+", default=[1 << 16, 1 << 18, 1 << 20])
    ap.add_argument("--json", action="store_true", help="end with one line: a JSON object of the results")
    a = ap.parse_args()
    n = a.mb << 20
    src = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    dst = np.empty_like(src)
    t_copy = best(lambda: np.copyto(dst, src), a.repeat)
    res: dict[str, dict[str, float]] = {"copy": {"gbps": n / t_copy / 1e9}}
    print(f"{'np.copyto':34s} {n / t_copy / 1e9:6.2f} GB/s")
    for c in candidates():
        row = {"gbps": n / best(lambda: c.whole(dst), a.repeat) / 1e9,
               "gbps_2_threads": n / best(two_threads(c.whole, dst), a.repeat) / 1e9}
        for chunk in a.chunks:
            t = best(fused(c, src, dst, chunk), a.repeat)
            row[f"copy_plus_{chunk >> 10}k_x_copy"] = t / t_copy
        res[c.name] = row
        fz = "  ".join(f"copy+sum {k[10:-7]:>5s} {v:4.2f}x" for k, v in row.items() if k.startswith("copy_plus"))
        print(f"{c.name:34s} {row['gbps']:6.2f} GB/s  2 threads {row['gbps_2_threads']:6.2f} GB/s  {fz}")
    if a.json:
        print(json.dumps(res, separators=(",", ":")))


if __name__ == "__main__":
    main()
