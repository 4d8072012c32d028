"""Configuration of restart-file I/O: ``[io]`` in the experiment file.

Example::

    [io]
    io_tasks = 8            # N_io; default min(P, N_e)
    threads = 2             # I/O threads per I/O task; default see IOConfig
    [io.safe_update]
    enabled = true
    method = "auto"         # "shadow": new copies renamed over the files; "log": a write-ahead log, in place
    log_dir = "/dev/shm"    # default: .enkflow-wal/ beside the member files (every node sees it);
                            # /dev/shm is faster but lost with its node (one-node runs only)
    durable = false         # true: fsync log and files (survives power loss; costs disk time)
"""

from __future__ import annotations

from enum import Enum

from pydantic import Field

from enkflow.config import Strict


class UpdateMethod(str, Enum):
    """How a crash-safe update keeps the files whole (docs/io.md "Crash-safe update")."""

    AUTO = "auto"  # SHADOW where every file allows it, else LOG
    SHADOW = "shadow"  # the new bytes into a copy of each file, renamed over it at the commit: written once
    LOG = "log"  # the new bytes into a write-ahead log, then in place: written twice, the files keep their inodes


class SafeUpdateConfig(Strict):
    """Crash-safe update (shadow files or a write-ahead log, a commit marker, idempotent recovery); see docs/io.md."""

    enabled: bool = Field(default=True, description="turn off only where another copy of the files exists")
    method: UpdateMethod = Field(default=UpdateMethod.AUTO, description="auto: shadow files where the directory is "
                                 "writable, the files ours, not hard-linked, and every state variable contiguous; else log")
    log_dir: str | None = Field(default=None, description="method log: directory of the log files; default .enkflow-wal/ beside the "
                                   "member files, seen by every node; /dev/shm is faster but lost with its node")
    durable: bool = Field(default=False, description="fsync logs, marker and files: survive power loss, not only process kills")


class LustreConfig(Strict):
    """Striping applied with ``lfs setstripe`` to files and directories enkflow creates on Lustre."""

    stripe_count: int = Field(default=-1, ge=-1, description="-1: all OSTs")
    stripe_size_mb: int = Field(default=64, ge=1, description="stripe size in MiB")


class IOConfig(Strict):
    """Parallel ensemble file I/O (Zheng et al. 2020)."""

    io_tasks: int | None = Field(default=None, ge=1, description="N_io I/O tasks among the P ranks; default min(P, N_e)")
    threads: int | None = Field(default=None, ge=1, description="I/O threads per I/O task; default min(4, CPUs) when P = 1, else 1")
    chunk_kb: int = Field(default=4096, ge=4, description="size of each pread/pwrite request and of the per-thread scratch buffer (KiB)")
    safe_update: SafeUpdateConfig = SafeUpdateConfig()
    lustre: LustreConfig = LustreConfig()
