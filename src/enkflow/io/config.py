"""Configuration of restart-file I/O: ``[io]`` in the experiment file.

Example::

    [io]
    io_tasks = 8            # N_io; default min(P, N_e)
    threads = 2             # I/O threads per I/O task; default see IOConfig
    [io.safe_update]
    enabled = true
    log_dir = "/dev/shm"    # default: .enkflow-wal/ beside the member files (every node sees it);
                            # /dev/shm is faster but lost with its node (one-node runs only)
    durable = false         # true: fsync log and files (survives power loss; costs disk time)
"""

from __future__ import annotations

from pydantic import Field

from enkflow.config import Strict


class SafeUpdateConfig(Strict):
    """Crash-safe update (write-ahead log, commit marker, idempotent redo); see docs/io.md."""

    enabled: bool = Field(default=True, description="turn off only where another copy of the files exists")
    log_dir: str | None = Field(default=None, description="directory of the log files; default .enkflow-wal/ beside the "
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
