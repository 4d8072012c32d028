"""Protected copies of member restarts: a forecast is applied exactly once.

A changed restart is no evidence that the model finished: a model killed
halfway through rewriting its restart in place leaves a changed, corrupt file.
So before a member's model first runs in a cycle, its restart is kept aside
(``.NAME.enkflow-cCYCLE.orig`` beside it, on the same file system). Every later
attempt of that member in that cycle (after a failure, a kill of the model or
of its worker, even one killed after the model exited 0 but before the member
was recorded as done) first restores the restart from it, then reruns the model.
The copy is removed once the member's done-marker exists.

How the copy is made depends on how the model writes (``model.restart_write``):

* ``in-place`` (the default, and the only safe assumption for an unknown model):
  a real copy. A reflink (``FICLONE``: btrfs, XFS, bcachefs, ZFS 2.2) costs
  nothing; else ``copy_file_range`` lets the file system copy without the data
  passing through this process (server-side on NFS 4.2 and Lustre), else a
  plain copy. Costs one read and one write of the restart per member per cycle
  where no reflink is possible (see docs/jobs.md for the figures).
* ``rename`` (the model, or the worker for an ``{output}`` model, replaces the
  restart by renaming a new file over it): a hard link, free. The old inode
  keeps the old content because nothing writes into it; the worker checks that
  after each run (:func:`link_intact`).
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
from pathlib import Path

from enkflow.errors import StorageError
from enkflow.fsutil import copy_range, fsync_dir
from enkflow.jobs.files import fingerprint
from enkflow.jobs.tasks import RestartWrite

_FICLONE = 0x40049409  # _IOW(0x94, 9, int) from linux/fs.h


def protected_path(restart: str | os.PathLike[str], cycle: int) -> Path:
    """Where the protected copy of ``restart`` for ``cycle`` lives (beside it: same file system)."""
    p = Path(restart)
    return p.with_name(f".{p.name}.enkflow-c{cycle}.orig")


def _tmp(path: Path) -> Path:
    return path.with_name(f"{path.name}.tmp{os.getpid()}")


def clone_file(src: Path, dst: Path) -> str:
    """Copy ``src`` to a new file ``dst`` (fsynced); returns how: ``reflink``, ``copy_file_range`` or ``copy``."""
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        try:
            fcntl.ioctl(fo.fileno(), _FICLONE, fi.fileno())
            how = "reflink"
        except OSError:
            how = copy_range(fi.fileno(), fo.fileno(), 0, os.fstat(fi.fileno()).st_size).value
        os.fsync(fo.fileno())
    shutil.copystat(src, dst)
    return how


def place(src: Path, dst: Path, *, link: bool = False) -> str:
    """Make ``dst`` hold ``src``'s content, atomically (a temporary sibling renamed over it, then
    the directory fsynced): a hard link with ``link``, else an independent copy (:func:`clone_file`).
    Returns how (``link``, ``reflink``, ``copy_file_range``, ``copy``); a failure raises
    :class:`StorageError` naming ``dst`` and leaves it as it was."""
    tmp = _tmp(dst)
    tmp.unlink(missing_ok=True)
    try:
        if link:
            os.link(src, tmp)
            how = "link"
        else:
            how = clone_file(src, tmp)
        os.replace(tmp, dst)
        fsync_dir(dst.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StorageError.from_os_error(exc, path=str(dst)) from None
    return how


def protect(restart: Path, prot: Path, mode: RestartWrite) -> str:
    """Keep ``restart`` aside as ``prot`` (atomically: ``prot`` exists only when complete):
    a copy for ``in-place`` models, a hard link for ``rename`` ones. Returns how it was made."""
    return place(restart, prot, link=mode is RestartWrite.RENAME)


def restore(prot: Path, restart: Path, mode: RestartWrite) -> None:
    """Put the protected content back as ``restart`` (atomically, by rename) and keep ``prot``.
    For ``in-place`` models the restart gets its own copy, so the next run cannot touch ``prot``."""
    place(prot, restart, link=mode is RestartWrite.RENAME)


def link_intact(prot: Path, before: dict[str, int] | None) -> bool:
    """Whether a hard-linked protected copy still has the content it had (``before``: its
    fingerprint when made); False means the model wrote into the restart in place."""
    return before is None or fingerprint(prot) == before


def discard(prot: Path) -> None:
    """Remove a protected copy (and a temporary left by a kill while making it)."""
    prot.unlink(missing_ok=True)
    for t in glob.glob(glob.escape(str(prot)) + ".tmp*"):
        Path(t).unlink(missing_ok=True)
