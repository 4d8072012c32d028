"""A writer's progress, visible to its senders without a message: one page of shared memory.

The writer's main thread bumps ``beat`` at every turn of its loop (at least once a second while
idle) and before and after every piece, and keeps a short text saying what it is doing (the
field, time and member of the piece it writes). A sender that waits for the writer (``sync``,
``close``, back-pressure) reads the page in bounded slices: a writer that is stopped (SIGSTOP),
stuck in a file-system call or looping inside one piece stops beating, while a slow writer that
keeps finishing pieces does not. Beats come from the main thread only, never from a helper thread,
which would go on beating while the main thread hangs. Layout::

    0    u64  beat       bumped by the writer
    8    u64  pieces     pieces written
    64   u32  length     of the activity text
    68   ...  activity   UTF-8, at most ACTIVITY_BYTES

The sender also counts bytes the writer process read or wrote (``/proc/PID/io`` ``rchar`` and
``wchar``, when it can read them) as progress: a long write to a slow disk is not a hang. A process
without a page (the mean/spread writer) is watched by its I/O bytes alone.
"""

from __future__ import annotations

import mmap
import os
import struct
import subprocess
import time
from pathlib import Path

import numpy as np

from enkflow.output.ring import unmap
from enkflow.shm_names import new_segment

PAGE = 4096
ACTIVITY_AT = 64
ACTIVITY_BYTES = PAGE - ACTIVITY_AT - 4


class Heartbeat:
    """One writer's progress page: the writer calls :meth:`beat` / :meth:`doing`, senders :meth:`read`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, PAGE)
        finally:
            os.close(fd)
        whole = np.frombuffer(self._map, dtype=np.uint8)
        self._counters = whole[:16].view(np.uint64)
        self._text = whole[ACTIVITY_AT:]

    @classmethod
    def create(cls) -> "Heartbeat":
        """A new page in /dev/shm (or the temporary directory); :meth:`unlink` removes its name."""
        path = new_segment("output-beat")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, PAGE)
        finally:
            os.close(fd)
        return cls(path)

    # -- the writer's side ---------------------------------------------------------------

    def beat(self, pieces: int | None = None) -> None:
        self._counters[0] += 1
        if pieces is not None:
            self._counters[1] = pieces

    def doing(self, what: str) -> None:
        """Say what the writer does now (and beat): the sender names it if the writer hangs there."""
        b = what.encode()[:ACTIVITY_BYTES]
        self._text[4 : 4 + len(b)] = np.frombuffer(b, dtype=np.uint8)
        self._text[:4] = np.frombuffer(struct.pack("<I", len(b)), dtype=np.uint8)
        self._counters[0] += 1

    # -- a sender's side -----------------------------------------------------------------

    def read(self) -> tuple[int, int]:
        """(beat, pieces)."""
        return int(self._counters[0]), int(self._counters[1])

    def activity(self) -> str:
        (n,) = struct.unpack("<I", self._text[:4].tobytes())
        return self._text[4 : 4 + min(n, ACTIVITY_BYTES)].tobytes().decode(errors="replace")

    def unlink(self) -> None:
        self.path.unlink(missing_ok=True)

    def close(self) -> None:
        unmap(self._map, self, "_counters", "_text")


def io_bytes(pid: int) -> int | None:
    """Bytes process ``pid`` has read and written (``rchar`` + ``wchar`` of /proc/PID/io), or None
    where that cannot be read."""
    try:
        with open(f"/proc/{pid}/io", "rb") as f:
            return sum(int(line.split()[1]) for line in f if line.startswith((b"rchar:", b"wchar:")))
    except (OSError, ValueError, IndexError):
        return None


def process_state(pid: int) -> str:
    """A few words on what the kernel says ``pid`` is doing, for the error message ('' if unknown)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return ""
    state = stat.rsplit(")", 1)[-1].split()[0:1]
    words = {"T": "stopped (SIGSTOP?)", "t": "stopped by a debugger", "D": "in an uninterruptible wait "
             "(a stuck file system?)", "R": "running", "S": "sleeping", "Z": "a zombie"}
    return words.get(state[0], f"state {state[0]}") if state else ""


class Silence:
    """How long a writer has made no progress, as one sender sees it (seconds, monotonic clock).

    Progress: the heartbeat changed (``hb`` None: there is none), or the process read or wrote
    bytes. The clock starts when the sender first looks, so it never overstates the silence."""

    def __init__(self, hb: Heartbeat | None, pid: int) -> None:
        self.hb = hb
        self.pid = pid
        self._last: tuple[int | None, int | None] | None = None
        self._since = time.monotonic()

    def seconds(self) -> float:
        now = time.monotonic()
        beat = self.hb.read()[0] if self.hb is not None else None
        if self._last is None or beat != self._last[0]:
            self._last = (beat, None)
            self._since = now
            return 0.0
        wrote = io_bytes(self.pid) if self.pid else None  # only read while the beat stands still
        if wrote is not None and wrote != self._last[1]:
            if self._last[1] is not None:
                self._since = now
            self._last = (beat, wrote)
        return now - self._since

    def observable(self) -> bool:
        """Whether this sender can see the writer's progress (its heartbeat page is mapped here, or
        its I/O bytes can be read)."""
        return self.hb is not None or bool(self.pid) and io_bytes(self.pid) is not None


def kill_if_stalled(proc: "subprocess.Popen", silence: Silence, limit: float) -> tuple[float, str] | None:
    """If ``proc`` (watched by ``silence``) went ``limit`` seconds without progress (``limit`` <= 0:
    never): kill it and return (seconds silent, ``the process was STATE`` or '' if unknown, the
    state read before the kill); else None."""
    silent = silence.seconds()
    if not (limit > 0 and silent > limit and silence.observable()):
        return None
    state = process_state(proc.pid)
    proc.kill()
    proc.wait()
    return silent, f"the process was {state}" if state else ""


def wait_progressing(proc: "subprocess.Popen", limit: float, poll_s: float = 0.5) -> int | str:
    """Wait for ``proc`` to end as long as it makes progress (:class:`Silence`, I/O bytes): its exit
    status, or, once it went ``limit`` seconds without (``limit`` <= 0: never), why it counts as
    hung, after it was killed."""
    silence = Silence(None, proc.pid)
    silence.seconds()
    while True:
        try:
            return proc.wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            pass
        stalled = kill_if_stalled(proc, silence, limit)
        if stalled is not None:
            silent, state = stalled
            return f"made no progress for {silent:.0f} s{f'; {state}' if state else ''}; killed"
