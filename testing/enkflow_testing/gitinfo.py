"""Which code a benchmark measured: the git commit of a source tree, for its report."""

from __future__ import annotations

import subprocess
from pathlib import Path


def code_version(src: Path) -> str:
    """The short commit of the checkout holding ``src``, with ``+dirty`` when ``src`` has
    uncommitted changes; ``unknown`` outside a git checkout."""
    try:
        top = subprocess.run(["git", "-C", str(src), "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                             check=True).stdout.strip()
        head = subprocess.run(["git", "-C", top, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", top, "status", "--porcelain", "--", str(src)], capture_output=True,
                               text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
