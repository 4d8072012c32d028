"""A real one-node SLURM on this machine, for tests and benchmarks.

A harness, not part of the installed package: ``tests/`` import it as
``enkflow_testing.localslurm`` (pytest's ``pythonpath``), ``benchmarks/`` put
``testing/`` on ``sys.path``.

Starts ``munged`` (if no munge daemon answers), ``slurmctld`` and
``slurmd`` from Debian's packages with a configuration under a private
directory, and stops what it started. Several may run at once (benchmarks
side by side): they share the one munged, which the last of them to stop
stops if one of them started it (:class:`MungeUsers`). The node can claim more CPUs than the
machine has (``SlurmdParameters=config_overrides``), which emulates a larger
node for jobs that mostly wait. Needs root and the packages
``slurmctld slurmd slurm-client munge``; :func:`ensure_installed` installs
them with apt-get when missing.

Usage::

    with LocalSlurm(workdir, cpus=16) as slurm:
        launcher = enkflow.jobs.SlurmLauncher(workdir / "scripts")  # SLURM_CONF is set in os.environ
"""

from __future__ import annotations

import math
import os
import random
import re
import fcntl
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Self

import psutil

from enkflow.errors import EnkflowError
from enkflow_testing.munge import install_key, munge_ok, own, start_munged

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
_MUNGE_DIRS = ["/run/munge", "/var/log/munge", "/var/lib/munge", "/etc/munge"]

# Settings every SLURM of the harness shares (the one-node one and the emulated cluster's).
DAEMON_SETTINGS = [
    "AuthType=auth/munge",
    "CredType=cred/munge",
    "ProctrackType=proctrack/linuxproc",
    "TaskPlugin=task/none",
    "SchedulerType=sched/backfill",
    # Schedule within a second of a change: the experiments measure queue waits.
    "SchedulerParameters=bf_interval=1,sched_min_interval=100000",
    "PriorityType=priority/basic",
    "SelectType=select/cons_tres",
    "SelectTypeParameters=CR_Core",
    "SlurmUser=root",
    "SlurmdUser=root",
    "ReturnToService=2",
    "MpiDefault=none",
    "JobAcctGatherType=jobacct_gather/none",
    "AccountingStorageType=accounting_storage/none",
    "SlurmdParameters=config_overrides",
    "KillWait=5",
    "MinJobAge=30",
    "InactiveLimit=0",
    "MessageTimeout=20",
]


def missing_reason() -> str | None:
    """Why a local SLURM cannot be started here (None if it can, possibly after installing)."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "needs a POSIX system"
    if os.geteuid() != 0:
        return "needs root to run slurmd/munged and install packages"
    if all(shutil.which(p, path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin") for p in ("slurmctld", "slurmd", "sbatch", "munged")):
        return None
    if not shutil.which("apt-get"):
        return "SLURM is not installed and apt-get is unavailable"
    return None


def ensure_installed(timeout_s: float = 900.0) -> None:
    """Install SLURM and munge with apt-get if they are absent (root only)."""
    if all(shutil.which(p, path="/usr/sbin:/usr/bin:/sbin:/bin") for p in ("slurmctld", "slurmd", "sbatch", "munged")):
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        subprocess.run(["apt-get", "update", "-q"], check=True, capture_output=True, env=env, timeout=timeout_s)
        subprocess.run(["apt-get", "install", "-y", "-q", *PACKAGES], check=True, capture_output=True, env=env, timeout=timeout_s)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, FileNotFoundError) as exc:
        out = getattr(exc, "stderr", b"") or b""
        raise EnkflowError(f"installing {' '.join(PACKAGES)} failed: {exc}; {out.decode(errors='replace')[-500:]}") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class LocalSlurm:
    """A one-node SLURM cluster under ``workdir``; a context manager.

    ``cpus``: CPUs the node offers (may exceed the real count);
    ``memory_mb``: its RealMemory. While started, ``os.environ['SLURM_CONF']``
    points at the private configuration so that ``sbatch`` and friends use it.
    The queue is first-come first-served (``priority/basic``): multifactor
    priorities are recomputed at most once a minute, too coarse for queues of
    seconds. ``queue`` says where a job that waits for a dependency ranks:

    * ``"submit"``: by its submission, as ``priority/basic`` does (it keeps
      its place while it waits);
    * ``"eligible"``: by the moment its dependency is satisfied, as on a
      production machine whose multifactor age factor counts eligible time
      only (see :class:`EligibleRanking`).
    """

    QUEUES = ("submit", "eligible")

    def __init__(self, workdir: str | os.PathLike[str], *, cpus: int | None = None, memory_mb: int | None = None,
                 queue: str = "submit"):
        if queue not in self.QUEUES:
            raise ValueError(f"queue must be one of {self.QUEUES}, not {queue!r}")
        self.dir = Path(workdir).resolve()
        self.cpus = cpus or os.cpu_count() or 1
        self.memory_mb = memory_mb or max(1024, int(psutil.virtual_memory().total / 2**20 * 0.8))
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.dir / "slurm.conf"
        self.queue = queue
        self._procs: list[subprocess.Popen] = []
        self._ranking: EligibleRanking | None = None
        self._old_conf: str | None = None

    def config_text(self, ctld_port: int, d_port: int) -> str:
        d = self.dir
        return "\n".join([
            "ClusterName=enkflow",
            f"SlurmctldHost={self.host}",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={d_port}",
            *DAEMON_SETTINGS,
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd.pid",
            f"SlurmctldLogFile={d}/slurmctld.log",
            f"SlurmdLogFile={d}/slurmd.log",
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN",
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ])

    def _start_munge(self) -> None:
        with MungeUsers.locked():
            MungeUsers.join(self)
            if munge_ok():
                return
            own(_MUNGE_DIRS)
            install_key(Path("/etc/munge/munge.key"))
            MungeUsers.started(start_munged())

    def start(self) -> "LocalSlurm":
        """Start the daemons and wait until the node is idle (at most 60 s)."""
        reason = missing_reason()
        if reason:
            raise EnkflowError(f"cannot start a local SLURM: {reason}")
        ensure_installed()
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(self.config_text(_free_port(), _free_port()))
        self._old_conf = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = str(self.conf)
        try:
            self._start_munge()
            for exe in ("slurmctld", "slurmd"):
                log = open(self.dir / f"{exe}.stdout", "wb")
                # -D: stay in the foreground so that we hold the PID; -c: no state from an earlier run.
                argv = [f"/usr/sbin/{exe}", "-D", "-f", str(self.conf)] + (["-c", "-i"] if exe == "slurmctld" else [])
                self._procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
                log.close()
                if exe == "slurmctld":
                    self._wait(lambda: subprocess.run(["scontrol", "ping"], capture_output=True, text=True).stdout.count("UP") > 0,
                               "slurmctld did not answer 'scontrol ping'")
            self._wait(self._node_idle, "the node did not become idle")
            if self.queue == "eligible":
                self._ranking = EligibleRanking().start()
        except BaseException:
            self.stop()
            raise
        return self

    def _node_idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True).stdout
        return "idle" in out

    def _wait(self, ok, message: str, timeout_s: float = 60.0) -> None:
        t0 = time.time()
        while time.time() - t0 < timeout_s:
            if any(p.poll() is not None for p in self._procs):
                break
            if ok():
                return
            time.sleep(0.3)
        logs = ""
        for name in ("slurmctld.log", "slurmd.log", "slurmctld.stdout", "slurmd.stdout"):
            p = self.dir / name
            if p.exists():
                logs += f"\n--- {name}:\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
        raise EnkflowError(f"local SLURM: {message} within {timeout_s:.0f} s{logs}")

    def stop(self) -> None:
        """Cancel every job, then stop the daemons this object started (by PID)."""
        if self._ranking is not None:
            self._ranking.stop()
            self._ranking = None
        if any(p.poll() is None for p in self._procs):
            subprocess.run(["scancel", "--user=root"], capture_output=True, timeout=30)
            time.sleep(0.5)
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._procs.clear()
        MungeUsers.leave(self)
        if self._old_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = self._old_conf

    def __enter__(self) -> "LocalSlurm":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class MungeUsers:
    """The LocalSlurm instances alive on this machine (a file per instance, named by its PID) and the
    munged one of them started: it stays while any is alive (another process's SLURM authenticates
    through it) and the last one to leave stops it."""

    DIR = Path("/run/enkflow-localslurm")
    MUNGED = DIR / "munged.pid"

    @classmethod
    def locked(cls):
        cls.DIR.mkdir(parents=True, exist_ok=True)
        return _FileLock(cls.DIR / "lock")

    @classmethod
    def _mark(cls, slurm: "LocalSlurm") -> Path:
        return cls.DIR / f"{os.getpid()}-{id(slurm)}"

    @classmethod
    def join(cls, slurm: "LocalSlurm") -> None:
        cls._mark(slurm).touch()

    @classmethod
    def started(cls, munged: subprocess.Popen) -> None:
        cls.MUNGED.write_text(f"{_munged_pid(munged)}\n")

    @classmethod
    def leave(cls, slurm: "LocalSlurm") -> None:
        with cls.locked():
            cls._mark(slurm).unlink(missing_ok=True)
            alive = [m for m in cls.DIR.iterdir() if m.name.split("-")[0].isdigit() and psutil.pid_exists(int(m.name.split("-")[0]))]
            if alive or not cls.MUNGED.exists():
                return
            pid = int(cls.MUNGED.read_text().split()[0])
            cls.MUNGED.unlink()
            try:
                proc = psutil.Process(pid)
                if proc.name() == "munged":
                    proc.terminate()
                    proc.wait(timeout=15)
            except (psutil.NoSuchProcess, psutil.TimeoutExpired):
                pass


class _FileLock:
    """An exclusive ``fcntl`` lock on ``path`` while the ``with`` block runs (processes and threads)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> "_FileLock":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _munged_pid(runner: subprocess.Popen) -> int:
    """The munged that ``runuser`` (``runner``) started: its child."""
    kids = psutil.Process(runner.pid).children()
    return kids[0].pid if kids else runner.pid


class _Poller:
    """A daemon thread calling :meth:`step` every ``period_s`` seconds between :meth:`start` and :meth:`stop`."""

    def __init__(self, period_s: float, name: str):
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=name)

    def step(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.period_s)

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class EligibleRanking(_Poller):
    """Ranks a dependent job by the moment it becomes eligible, not by its submission.

    On production machines (``priority/multifactor``) the age factor counts
    only the time a job has been eligible to run, so an analysis job submitted
    with ``--dependency`` queues behind every job that waited while its
    members ran: the second queue wait of the per-member strategy (Zheng et
    al., GMD 2020). ``priority/basic`` instead keeps its submission rank. This
    thread reproduces the production rule on the local SLURM: a pending job
    with unfulfilled dependencies is held (``scontrol hold``), and released
    once they are fulfilled; ``priority/basic`` gives a released job the next
    lowest priority, i.e. the back of the queue at its eligible time. The poll
    period (``period_s``) adds at most that much to the dependent job's wait.
    """

    def __init__(self, period_s: float = 0.2):
        super().__init__(period_s, "eligible-ranking")
        self.held: set[str] = set()

    def _queue(self) -> dict[str, tuple[str, str]]:
        """Every job in the queue: id -> (state, remaining dependencies)."""
        out = subprocess.run(["squeue", "-h", "-o", "%i|%T|%E"], capture_output=True, text=True).stdout
        jobs = {}
        for line in out.splitlines():
            parts = line.split("|", 2)
            if len(parts) == 3:
                jobs[parts[0]] = (parts[1], parts[2])
        return jobs

    def step(self) -> None:
        """One pass: hold newly seen dependent jobs; release held ones whose dependencies have left the queue.

        A job it held is released when no job it depends on is still queued,
        running or completing, whether or not SLURM has already marked the
        dependency fulfilled (it may clear it, to ``(null)``, between two
        passes, even for a held job); SLURM then checks the dependency type
        (``afterok`` and the like) itself.
        """
        jobs = self._queue()
        active = {j for j, (state, _) in jobs.items() if state not in ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT")}
        for job, (state, deps) in jobs.items():
            if state != "PENDING":
                continue
            if job in self.held:
                if not (set(re.findall(r":(\d+)", deps)) & active):
                    if subprocess.run(["scontrol", "release", job], capture_output=True).returncode == 0:
                        self.held.discard(job)
            elif "unfulfilled" in deps:
                if subprocess.run(["scontrol", "hold", job], capture_output=True).returncode == 0:
                    self.held.add(job)
        self.held &= jobs.keys()  # cancelled or finished jobs


class BackgroundLoad(_Poller):
    """A bounded background load: keeps ``jobs`` one-CPU jobs of other "users" in the queue.

    Each job sleeps a random time in the ``duration_s`` range (seconds,
    seeded) drawn from ``distribution``: ``"uniform"`` or ``"loguniform"``,
    the heavy-tailed law measured for production job run times (Downey 1997,
    "A parallel workload model and its implications for processor allocation"):
    many short jobs and a few long ones, which is what makes a job that needs a
    whole node wait for its slowest occupant. Whenever fewer than ``jobs`` are
    queued or running, new ones are submitted, so the node stays busy and
    experiment jobs must queue behind them as on a shared machine. Start with
    :meth:`start`, stop (cancelling its jobs) with :meth:`stop`; also a context
    manager.
    """

    DISTRIBUTIONS = ("uniform", "loguniform")

    NAME = "bgload"

    def __init__(self, jobs: int, duration_s: tuple[float, float] = (8.0, 24.0), seed: int = 0, period_s: float = 0.3,
                 distribution: str = "uniform"):
        if distribution not in self.DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {self.DISTRIBUTIONS}, not {distribution!r}")
        if not 0 < duration_s[0] <= duration_s[1]:
            raise ValueError(f"duration_s must be 0 < low <= high seconds, not {duration_s}")
        self.jobs = jobs
        self.duration_s = duration_s
        self.distribution = distribution
        super().__init__(period_s, "background-load")
        self.rng = random.Random(seed)
        self.submitted = 0

    def _count(self) -> int:
        out = subprocess.run(["squeue", "--me", "-h", "-n", self.NAME, "-o", "%i"], capture_output=True, text=True).stdout
        return len(out.split())

    @staticmethod
    def draw(rng: random.Random, duration_s: tuple[float, float], distribution: str) -> tuple[float, int]:
        """One load job: (duration s, time limit in whole minutes, as a site would require)."""
        lo, hi = duration_s
        if distribution == "loguniform":
            secs = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        else:
            secs = rng.uniform(lo, hi)
        return secs, int(secs // 60) + 1

    def step(self) -> None:
        """Top the queue up to ``jobs`` load jobs."""
        for _ in range(max(0, self.jobs - self._count())):
            # The time limit lets backfill plan around these jobs.
            secs, limit = self.draw(self.rng, self.duration_s, self.distribution)
            subprocess.run(["sbatch", "-J", self.NAME, "-n", "1", f"--time={limit}", "--output=/dev/null",
                            f"--wrap=sleep {secs:.2f}"],
                           capture_output=True)
            self.submitted += 1

    def stop(self) -> None:
        super().stop()
        subprocess.run(["scancel", "--me", "-n", self.NAME], capture_output=True)

    def __enter__(self) -> "BackgroundLoad":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
