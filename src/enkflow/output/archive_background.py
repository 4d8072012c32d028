"""The experiment's side of background archiving: stage a cycle, run the archiver process, report.

:class:`BackgroundArchiver` is used by the offline driver (after each cycle's
analysis: the member restarts) and by the online server (after each analysis:
its analysis checkpoints). :meth:`~BackgroundArchiver.stage` clones the files
(the one step on the cycle's path: a reflink, or a file-system copy), then an
archiver process (:mod:`enkflow.output.archive`, at lower CPU priority)
compresses and checksums them while the next forecast runs. At most one
archiver runs at a time; it archives every staged cycle, so a cycle whose
archiver died (``kill -9``, a full disk) is archived again by the next one.

A failed archiver is reported loudly: an ``archive_fail`` event (listed by
``enkflow report`` under warnings), a Python warning and a progress line; with
``[archive] on_failure = "stop"`` the next :meth:`~BackgroundArchiver.poll`
raises, which stops the experiment.
"""

from __future__ import annotations

import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from enkflow.errors import EnkflowError
from enkflow.jobs.events import EventLog
from enkflow.jobs.files import log_tail
from enkflow.output import archive as _archive
from enkflow.output.heartbeat import wait_progressing


class ArchiveFailure(EnkflowError):
    """The archiver failed and ``[archive] on_failure = "stop"``."""


@dataclass(frozen=True)
class ArchiveSetup:
    """What the background archiver needs of a study: the ``[archive]`` settings and its paths (the
    experiment layer builds it: :func:`enkflow.experiment.output_setup.archive_setup`)."""

    root: Path  # the archive ([archive] dir)
    staging: Path  # where cycles wait for the archiver
    log: Path  # the archiver's stderr (appended)
    keep_last: int  # archived cycles kept, newest first (0: all)
    keep_every: int  # also keep every cycle divisible by this (0: none)
    compression: Literal["gzip", "none"]
    level: int  # gzip (zlib) level, 1..9
    on_failure: Literal["warn", "stop"]
    timeout: float  # seconds the archiver may make no progress while the run waits for it; 0: for ever
    python: str | None = None  # the interpreter that runs it (default: this one)


class BackgroundArchiver:
    """Stages cycles under ``setup.staging`` and archives them into ``setup.root`` in a background process."""

    def __init__(self, setup: ArchiveSetup, events: EventLog, progress: Callable[[str], None] | None = None):
        self.setup, self.root, self.staging = setup, setup.root, setup.staging
        self.events, self.log, self.python = events, setup.log, setup.python or sys.executable
        self.progress = progress
        self._proc: subprocess.Popen | None = None
        self.failures = 0

    def stage(self, cycle: int, files: list[tuple[Path, str, str]], meta: dict, *, link: bool = False) -> None:
        """Snapshot the files of ``cycle`` and start archiving them (see :func:`enkflow.output.archive.stage`).
        A failed snapshot (e.g. a full disk) is reported like a failed archiver."""
        t0 = time.perf_counter()
        try:
            _archive.stage(self.staging, cycle, files, meta, link=link)
        except (EnkflowError, OSError) as exc:
            self._report(f"staging cycle {cycle} for the archive failed: {exc}", cycles=[cycle], returncode=None)
            return
        self.events.emit("archive_stage", cycle=cycle, files=len(files), stage_s=time.perf_counter() - t0)
        self.poll()

    def poll(self) -> None:
        """Collect a finished archiver (reporting a failure) and start one if cycles are staged."""
        if self._proc is not None:
            rc = self._proc.poll()
            if rc is None:
                return
            self._proc = None
            if rc != 0:
                self._failed(rc)
        if _archive.staged_cycles(self.staging) and self._proc is None:
            self._start()

    def _start(self) -> None:
        s = self.setup
        self.log.parent.mkdir(parents=True, exist_ok=True)
        argv = [self.python, "-m", "enkflow.output.archive", str(self.staging), str(self.root),
                "--events", str(self.events.path), "--keep-last", str(s.keep_last), "--keep-every", str(s.keep_every),
                "--level", str(s.level), "--compression", s.compression]
        with open(self.log, "ab") as err:
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)

    def _failed(self, rc: int | str) -> None:
        """Report a failed archiver: its exit status, or why it counted as hung (:func:`wait_progressing`)."""
        cycles = _archive.staged_cycles(self.staging)
        returncode: int | None
        if isinstance(rc, str):
            what, returncode = f"{rc} ([archive] timeout = {self.setup.timeout:g} s)", None
        else:
            what, returncode = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}", rc
        tail = log_tail(self.log, 5) if self.log.exists() else ""
        msg = (f"archiving of cycle(s) {', '.join(map(str, cycles)) or '?'} to {self.root} failed ({what}); "
               f"see {self.log}" + (f":\n{tail}" if tail.strip() else ""))
        self._report(msg, cycles=cycles, returncode=returncode)

    def _report(self, msg: str, *, cycles: list[int], returncode: int | None) -> None:
        self.failures += 1
        self.events.emit("archive_fail", cycles=cycles, returncode=returncode, error=msg, log=str(self.log))
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        if self.progress is not None:
            self.progress(f"WARNING: {msg}")
        if self.setup.on_failure == "stop":
            raise ArchiveFailure(msg + "\n([archive] on_failure = \"stop\"; the staged cycles stay under "
                                 f"{self.staging} and are archived by the next run)")

    def finish(self, *, retries: int = 1) -> None:
        """Wait until every staged cycle is archived; after a failure the archiver runs again,
        ``retries`` times at most (each failure is reported)."""
        starts = 0
        while True:
            if self._proc is not None:
                rc = wait_progressing(self._proc, self.setup.timeout)
                self._proc = None
                if rc != 0:
                    self._failed(rc)
            if not _archive.staged_cycles(self.staging) or starts >= retries:
                return
            self._start()
            starts += 1

    def close(self) -> None:
        """Stop waiting for a running archiver (it finishes on its own; a rerun archives what is left)."""
        self._proc = None
