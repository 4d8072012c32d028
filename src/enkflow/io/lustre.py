"""Lustre striping hints: ``lfs setstripe`` on files and directories enkflow creates.

On any other file system (or without the ``lfs`` command) every function here is a no-op.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from enkflow.io.config import LustreConfig


def filesystem_type(path: str | os.PathLike[str]) -> str:
    """The type (``lustre``, ``ext4``, ``tmpfs``...) of the mount holding ``path``."""
    p = os.path.realpath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    best, kind = "", ""
    try:
        with open("/proc/mounts") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (p == mnt or p.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        return ""
    return kind


def is_lustre(path: str | os.PathLike[str]) -> bool:
    return filesystem_type(path) == "lustre"


def setstripe(path: str | os.PathLike[str], config: LustreConfig | None = None) -> bool:
    """Give a new (not yet existing) file, or a directory, the configured striping.

    Must run before the file is created: Lustre fixes a file's layout at creation. Returns True
    when a layout was set, False where this is not Lustre or ``lfs`` is missing.
    """
    cfg = config or LustreConfig()
    target = Path(path)
    where = target if target.exists() else target.parent
    if not is_lustre(where):
        return False
    lfs = shutil.which("lfs")
    if lfs is None:
        return False
    cmd = [lfs, "setstripe", "-c", str(cfg.stripe_count), "-S", f"{cfg.stripe_size_mb}M", str(target)]
    return subprocess.run(cmd, capture_output=True).returncode == 0
