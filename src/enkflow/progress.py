"""Progress of long work: a tqdm bar on a terminal, plain lines otherwise (logs, pipes, CI)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TextIO, TypeVar

T = TypeVar("T")


def progress(items: Iterable[T], *, total: int | None = None, desc: str = "", stream: TextIO | None = None,
             every: int = 1) -> Iterator[T]:
    """Yield ``items``, showing progress on ``stream`` (default stderr): a tqdm bar when the
    stream is a terminal, else one line ``desc: i/total`` every ``every`` items and at the end."""
    stream = stream or sys.stderr
    if total is None:
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:
            total = None
    if getattr(stream, "isatty", lambda: False)():
        from tqdm import tqdm

        yield from tqdm(items, total=total, desc=desc, file=stream, leave=False)
        return
    i = 0
    for i, item in enumerate(items, 1):
        yield item
        if i % every == 0 or i == total:
            print(f"{desc}: {i}/{total if total is not None else '?'}", file=stream, flush=True)
