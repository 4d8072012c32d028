"""Fault trials of the online mode: runners and the server killed, hung, joining and leaving
mid-cycle; the results must stay bitwise equal to the fault-free run and only the forecasts in
flight at the failure may be computed again.

Used by ``tests/online/test_online_faults.py`` (one trial per scenario) and
``benchmarks/online_fault_trials.py`` (randomized trials). One experiment: the demo problem
(``enkflow.experiment.demo_problem.prepare``, tiny synthetic land, LETKF) in online mode, with short
``[online] heartbeat`` / ``heartbeat_timeout`` and a demo runner that idles ``--sleep`` seconds per
forecast (an emulated model cost, so that "mid-forecast" can be hit). Each trial copies the pristine
experiment to the same path (``WORK/trial``: the analysis mean files name their template's path),
runs ``enkflow run TOML`` in its own session, follows ``run/events.jsonl`` to reach the chosen
moment, injects the fault, waits for the end and compares with the fault-free reference.

Scenarios (:data:`SCENARIOS`); the victims' process IDs come from the events (the server's
``online_start`` is emitted by the server process, ``pid``; a runner's name is ``HOST:PID``):

``runner-kill``
    SIGKILL the runner holding member *m* of cycle *K* (random), a random fraction of ``--sleep``
    after it got the member: mid-forecast. The server notices the missing heartbeats.
``runner-stop``
    SIGSTOP that runner instead (it hangs); variant ``cont``: SIGCONT after 1.5-3 heartbeat
    timeouts (its late forecast must be discarded, it greets the server again); variant ``left``:
    it stays stopped until the supervisor cancels it at the end.
``server-before-ckpt``
    SIGKILL the server during cycle *K*'s forecasts, before any of them was checkpointed
    (within ``--sleep`` of the cycle's first assignment).
``server-after-ckpt``
    SIGKILL the server as soon as *j* (random, 1..N-2) forecasts of cycle *K* are checkpointed.
``server-analysis``
    SIGKILL the server inside cycle *K*'s analysis, at one of the system calls of
    :data:`ANALYSIS_POINTS` (random): strace attaches to the server and delivers SIGKILL on
    entering that call (the kernel skips it), like ``faults.py`` does for the offline analysis.
``rank-kill``, ``rank-stop`` (a server of ``ranks`` > 1)
    SIGKILL (mpiexec ends the other ranks) or SIGSTOP (a hung rank, or a node gone without a word:
    rank 0 hears no heartbeat on the bus for ``rank_timeout``) the server's last rank during cycle
    *K*'s forecasts, as ``server-before-ckpt`` times its kill; the server must stop and restart.
``join-leave``
    During cycle *K* (not the last) an extra runner is started by hand (the ``[online] runner``
    command); once it has joined (in cycle K or K + 1: it takes a second or two to start), the runner
    that gets the next member is sent SIGTERM mid-forecast: it must leave cleanly (BYE:
    ``runner_leave``, its member requeued at once, reason ``left``). The extra runner must stop by
    itself at the end (STOP).

The figures per trial (:class:`OnlineTrialResult`): ``recomputed`` = member forecasts started
beyond those of the fault-free run (``task_assign`` events of every server incarnation minus the
reference's: N x cycles plus the statelessness check's repeat run); ``in_flight`` = the forecasts the fault interrupted (the victim runner's tasks that
never completed; for a server kill, the killed server's tasks without ``task_done``) and ``lost``
= forecasts the killed server had accepted but not yet checkpointed. The target is
``recomputed == in_flight + lost`` (less when an interrupted statelessness probe is not repeated). For server kills the checkpoint directory is listed right
after the kill: a forecast checkpointed then must not be assigned again (``redone_checkpointed``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from enkflow.shm_names import maker_pid, shm_dir
from enkflow_testing.faults import kill_tree, strace_path, wait_gone, wal_logs

SCENARIOS = ("runner-kill", "runner-stop", "server-before-ckpt", "server-after-ckpt", "server-analysis", "join-leave",
             "rank-kill", "rank-stop")

#: Kill points inside cycle K's analysis for ``server-analysis``: (system call, path, ``when``
#: choices, the cycles it exists in). Paths: ``{obs}`` the cycle's observation file, ``{run}`` the
#: run directory, ``{ckpt}`` the checkpoint directory, ``{pid}`` the server's PID (temporary names),
#: ``{m}`` a random member, ``{prev}`` = K - 1. strace counts ``when`` per thread (faults.py).
ANALYSIS_POINTS: dict[str, tuple[str, str, tuple[int, ...], str]] = {
    # The analysis starts: every forecast of K is in and checkpointed; the observations are read.
    "obs-read": ("openat", "{obs}", (1,), "any"),
    # The analysis mean and spread handed to the writer of the mean/spread files (raw rows; the files
    # themselves are written by that process, and the checkpoint waits for them).
    "rows-write": ("openat", "{run}/online/mean_spread_{cycle:04d}.f8", (1,), "any"),
    # The analysis checkpoint (background thread): its writes, its publication, the pruning after it.
    "ckpt-write": ("pwrite64", "{ckpt}/.analysis_{cycle:04d}.rank_0000.h5.{pid}.tmp", (1, 2, 3, 4), "any"),
    "ckpt-rename": ("rename", "{ckpt}/.analysis_{cycle:04d}.rank_0000.h5.{pid}.tmp", (1,), "any"),
    "prune": ("unlink", "{ckpt}/forecast_{prev:04d}/member_{m:04d}.rank_0000.h5", (1,), "not-first"),
    # After the last analysis: the final analysis written into the member restarts (write-ahead log).
    "final-update": ("pwrite64", "{root}/members/member_{m:04d}.nc", (1,), "last"),
}


@dataclass
class OnlineTrialResult:
    n: int
    scenario: str
    where: str = ""  # the planned moment
    outcome: str = "error"  # equal | differs | error
    detail: str = ""
    hit: str = ""  # what was done (victim, signal)
    cycle: int = 0
    rc: int | None = None
    seconds: float = 0.0
    tasks: int = 0  # task_assign events
    recomputed: int = 0  # tasks - the fault-free run's tasks
    in_flight: int = 0  # forecasts interrupted by the fault
    lost: int = 0  # server kills: forecasts accepted but not checkpointed
    checkpointed: int = 0  # server kills: forecasts of the unfinished cycle checkpointed at the kill
    redone_checkpointed: list = field(default_factory=list)  # (cycle, member) checkpointed, yet assigned again
    recovered: int | None = None  # forecasts the restarted server recovered
    requeues: dict = field(default_factory=dict)  # task_requeue reasons
    server_restarts: int = 0
    injected: bool = True  # the fault happened as planned (strace fired, the victim existed)
    clean_leave: bool | None = None  # join-leave: the SIGTERMed runner said BYE
    segments_left: list = field(default_factory=list)  # the run's online shared-memory segments left behind
    addresses: list = field(default_factory=list)  # the distinct addresses the server's starts listened at

    @property
    def expected(self) -> int:
        return self.in_flight + self.lost

    @property
    def recompute_ok(self) -> bool:
        """Nothing but the interrupted forecasts was redone (fewer: a statelessness probe's repeat run
        in flight at a server kill is not run again when the restarted server skips the check)."""
        return self.recomputed <= self.expected and not self.redone_checkpointed

    def row(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(expected=self.expected, recompute_ok=self.recompute_ok)
        return d


@dataclass
class Reference:
    files: dict[str, bytes]
    seconds: float
    tasks: int


class EventTail:
    """``events.jsonl`` read as it grows (complete lines only)."""

    def __init__(self, path: Path):
        self.path = path
        self.pos = 0
        self.rest = b""
        self.all: list[dict] = []

    def poll(self) -> list[dict]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.pos)
                data = fh.read()
        except FileNotFoundError:
            return []
        self.pos += len(data)
        lines = (self.rest + data).split(b"\n")
        self.rest = lines.pop()
        new = []
        for raw in lines:
            try:
                new.append(json.loads(raw))
            except ValueError:
                continue
        self.all.extend(new)
        return new

    def wait(self, pred: Callable[[dict], bool], deadline: float, start: int = 0,
             alive: Callable[[], bool] = lambda: True) -> dict | None:
        """The first event from index ``start`` on that satisfies ``pred`` (None: deadline passed or
        ``alive()`` turned false)."""
        i = start
        while True:
            self.poll()
            while i < len(self.all):
                if pred(self.all[i]):
                    return self.all[i]
                i += 1
            if time.monotonic() > deadline or not alive():
                return None
            time.sleep(0.003)


def nc_content(path: Path) -> bytes:
    """A NetCDF file's content as bytes: dimensions, every variable's dtype, shape, attributes and raw
    data, the global attributes except ``history`` (which write_mean_spread stamps with the time)."""
    import hashlib

    import netCDF4
    import numpy as np

    h = hashlib.sha256()
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        attrs = {k: repr(ds.getncattr(k)) for k in ds.ncattrs() if k != "history"}
        h.update(json.dumps([attrs, {d: len(v) for d, v in ds.dimensions.items()}], sort_keys=True).encode())
        for name, v in ds.variables.items():
            a = np.ascontiguousarray(v[...])
            h.update(json.dumps([name, str(a.dtype), a.shape, {k: repr(v.getncattr(k)) for k in v.ncattrs()}],
                                sort_keys=True).encode())
            h.update(a.tobytes())
    return h.hexdigest().encode()


def _pid_of(name: str) -> int | None:
    try:
        return int(str(name).rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _signal(pid: int | None, sig: int, must_contain: str) -> bool:
    """Send ``sig`` to ``pid`` if that process is what we think it is."""
    if pid is None or must_contain not in _cmdline(pid):
        return False
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _server_rank(root: Path, rank: int) -> int | None:
    """The PID of the server process of rank ``rank`` of the experiment in ``root`` (MPI's PMI_RANK)."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and f"enkflow.online.experiment {root}" in _cmdline(int(d.name)):
            try:
                env = (d / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"PMI_RANK={rank}".encode() in env:
                return int(d.name)
    return None


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


class OnlineFaultHarness:
    """Fault trials of one small online experiment. Call :meth:`reference` first.

    ``sleep`` is the runner's idle seconds per forecast; ``heartbeat``/``heartbeat_timeout``/
    ``due_floor`` the ``[online]`` settings (short, so that a lost runner is noticed fast; the due
    date must stay well above a forecast's duration, or slow forecasts are redone as "late");
    ``ranks``/``rank_timeout`` the server's (the ``rank-*`` scenarios need ``ranks`` > 1).
    """

    def __init__(self, work: str | Path, *, members: int = 8, cycles: int = 3, runners: int = 3, sleep: float = 0.3,
                 heartbeat: float = 0.2, heartbeat_timeout: float = 1.0, due_floor: float = 5.0,
                 ranks: int = 1, rank_timeout: float = 10.0, env: dict[str, str] | None = None,
                 python: str | None = None, run_timeout: float = 150.0,
                 keep_failed: bool = True, say: Callable[[str], None] | None = None):
        self.work = Path(work).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.members, self.cycles, self.runners, self.sleep = members, cycles, runners, sleep
        self.heartbeat, self.heartbeat_timeout, self.due_floor = heartbeat, heartbeat_timeout, due_floor
        self.ranks, self.rank_timeout = ranks, rank_timeout
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("OMP_NUM_THREADS", "1")
        self.env.setdefault("OPENBLAS_NUM_THREADS", "1")
        self.python = python or sys.executable
        self.run_timeout = run_timeout
        self.keep_failed = keep_failed
        self.say = say or (lambda _m: None)
        self.base = self.work / "base"
        self.root = self.work / "trial"
        self.ref: Reference | None = None
        self.strace = strace_path(install=False) or "strace"
        self._prepare()

    # -- the experiment -------------------------------------------------------------------------

    def _prepare(self) -> None:
        from enkflow.experiment.demo_problem import DemoSettings, prepare

        stamp = self.base / ".complete"
        key = f"{self.members} {self.cycles} {self.runners} {self.sleep} {self.heartbeat} {self.heartbeat_timeout} " \
              f"{self.due_floor} {self.python} {self.ranks} {self.rank_timeout}"
        if stamp.exists() and stamp.read_text() == key:
            return
        if self.base.exists():
            shutil.rmtree(self.base)
        self.base.mkdir(parents=True)
        toml = prepare(self.base, DemoSettings(members=self.members, cycles=self.cycles, mode="online",
                                               runners=self.runners), lambda _m: None)
        text = toml.read_text()
        runner = (f"{self.python} -m enkflow.online.models demo --address {{address}} --token-file {{token_file}} "
                  f"--grid {{restart}} --length {{length}} --sleep {self.sleep:g}")
        text = text[:text.index("\n[online]")] + f"""
[online]
runner = {json.dumps(runner)}
runners = {self.runners}
heartbeat = {self.heartbeat:g}
heartbeat_timeout = {self.heartbeat_timeout:g}
due_floor = {self.due_floor:g}
ranks = {self.ranks}
rank_timeout = {self.rank_timeout:g}
"""
        toml.write_text(text)
        stamp.write_text(key)

    @property
    def toml(self) -> Path:
        return self.root / "experiment.toml"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def ckpt_dir(self) -> Path:
        return self.run_dir / "online" / "checkpoints"

    def _member_paths(self) -> list[Path]:
        return [self.root / "members" / f"member_{m:04d}.nc" for m in range(1, self.members + 1)]

    def _clean_wal(self) -> None:
        """Write-ahead logs of the trial's ensemble left by a server killed in its final update."""
        for p in wal_logs(self._member_paths()):
            try:
                p.unlink()
            except OSError:
                pass

    def _fresh(self) -> None:
        if self.root.exists():
            left = wait_gone(self.root, 10.0)
            if left:
                self.say(f"  (killed {len(left)} leftover processes of the previous trial)")
            shutil.rmtree(self.root)
        self._clean_wal()
        shutil.copytree(self.base, self.root, symlinks=True)

    def _start(self) -> subprocess.Popen:
        fh = open(self.root / "driver.log", "ab")
        try:
            return subprocess.Popen([self.python, "-m", "enkflow", "run", str(self.toml)], stdout=fh,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                                    start_new_session=True, cwd=self.root)
        finally:
            fh.close()

    def _outputs(self) -> dict[str, bytes]:
        """What is compared bitwise: every byte of the final member restarts; every cycle's analysis
        mean and spread (every variable's bytes and every attribute but ``history``, a time stamp)."""
        out: dict[str, bytes] = {}
        for p in self._member_paths():
            out[str(p.relative_to(self.root))] = p.read_bytes()
        for k in range(1, self.cycles + 1):
            for name in ("analysis_mean.nc", "analysis_spread.nc"):
                p = self.run_dir / "cycles" / f"{k:04d}" / name
                if p.exists():
                    out[str(p.relative_to(self.root))] = nc_content(p)
        return out

    def _compare(self) -> tuple[str, str]:
        assert self.ref is not None, "run reference() first"
        try:
            got = self._outputs()
        except OSError as exc:
            return "error", f"outputs unreadable: {exc}"
        missing = sorted(set(self.ref.files) - set(got))
        bad = sorted(k for k in self.ref.files if k in got and got[k] != self.ref.files[k])
        if missing or bad:
            parts = []
            if missing:
                parts.append("missing " + ", ".join(missing))
            if bad:
                parts.append("differ: " + ", ".join(bad))
            return "differs", "; ".join(parts)
        return "equal", ""

    def _wait_run(self, proc: subprocess.Popen, deadline: float) -> int:
        try:
            return proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid, self.root)
            proc.wait()
            return 124

    def reference(self) -> Reference:
        """The fault-free run, in the trial directory: its outputs (and a warm cache)."""
        self._fresh()
        t0 = time.perf_counter()
        proc = self._start()
        rc = self._wait_run(proc, time.monotonic() + self.run_timeout)
        secs = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"the fault-free reference run failed (exit {rc}); see {self.root}/driver.log")
        events = EventTail(self.run_dir / "events.jsonl")
        events.poll()
        # N x cycles, plus the statelessness check's repeat run in the first cycle (when enabled).
        tasks = sum(e.get("event") == "task_assign" for e in events.all)
        redone = [e for e in events.all if e.get("event") == "task_requeue"]
        self.ref = Reference(self._outputs(), secs, tasks)
        wait_gone(self.root, 10.0)
        if redone:
            raise RuntimeError(f"the fault-free run redid {len(redone)} forecasts ({redone[0].get('reason')}: due dates too "
                               f"short for this machine?); see {self.run_dir}/events.jsonl")
        return self.ref

    # -- trials -------------------------------------------------------------------------------------

    def trial(self, n: int, scenario: str, rng: random.Random, *, variant: str | None = None,
              cycle: int | None = None, point: str | None = None) -> OnlineTrialResult:
        """One trial of ``scenario`` at a random moment (``cycle``, ``variant`` (runner-stop: cont/left)
        and ``point`` (server-analysis) may be fixed)."""
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; one of {SCENARIOS}")
        assert self.ref is not None, "run reference() first"
        self._fresh()
        # A runner started by hand needs a second or two to join: not in the last cycle, or the study may be over.
        last = self.cycles - 1 if scenario == "join-leave" and self.cycles > 1 else self.cycles
        res = OnlineTrialResult(n, scenario, cycle=cycle or rng.randint(1, last))
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.run_timeout
        segments = set(shm_dir().glob("enkflow-online-*"))
        proc = self._start()
        ev = EventTail(self.run_dir / "events.jsonl")
        ctx = _Trial(self, proc, ev, res, rng, deadline)
        try:
            if scenario in ("runner-kill", "runner-stop"):
                ctx.runner_fault(signal.SIGKILL if scenario == "runner-kill" else signal.SIGSTOP,
                                 variant or rng.choice(("cont", "left")))
            elif scenario == "server-before-ckpt":
                ctx.server_before_ckpt()
            elif scenario == "server-after-ckpt":
                ctx.server_after_ckpt()
            elif scenario == "server-analysis":
                ctx.server_analysis(point)
            elif scenario in ("rank-kill", "rank-stop"):
                ctx.rank_fault(signal.SIGKILL if scenario == "rank-kill" else signal.SIGSTOP)
            else:
                ctx.join_leave()
            res.rc = self._wait_run(proc, deadline)
        finally:
            ctx.cleanup()
            if proc.poll() is None:
                kill_tree(proc.pid, self.root)
                proc.wait()
        left = wait_gone(self.root, 20.0)
        # Every process of the run is gone: a new name of a dead maker is one the run left behind (a
        # live maker's is another study's, on this shared machine).
        res.segments_left = sorted(p.name for p in set(shm_dir().glob("enkflow-online-*")) - segments
                                   if not Path(f"/proc/{maker_pid(p.name)}").exists())
        ev.poll()
        ctx.account()
        if res.rc != 0:
            res.outcome, res.detail = "error", f"enkflow run exit {res.rc}; see driver.log"
        else:
            res.outcome, res.detail = self._compare()
        notes = list(ctx.notes)
        if left:
            notes.append(f"{len(left)} processes left running")
        if notes:
            res.detail = "; ".join(([res.detail] if res.detail else []) + notes)
        res.seconds = time.perf_counter() - t0
        if (res.outcome != "equal" or not res.recompute_ok) and self.keep_failed:
            dest = self.work / "failed" / f"{res.n:03d}-{scenario}"
            if dest.exists():
                shutil.rmtree(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(self.root, dest, symlinks=True)
            res.detail += f" (kept in {dest})"
        return res


class _Trial:
    """The moving parts of one trial: the run, its events, the victims."""

    def __init__(self, h: OnlineFaultHarness, proc: subprocess.Popen, ev: EventTail, res: OnlineTrialResult,
                 rng: random.Random, deadline: float):
        self.h, self.proc, self.ev, self.res, self.rng, self.deadline = h, proc, ev, res, rng, deadline
        self.notes: list[str] = []
        self.t_fault: float | None = None  # time.time() of the fault (the events' clock)
        self.victim_runner: str | None = None  # runner name (runner faults)
        self.victim_server: int | None = None  # killed server PID
        self.snapshot: set[tuple[int, int]] = set()  # forecast checkpoints at the kill
        self.analyses: set[int] = set()  # analysis checkpoints at the kill
        self.stopped: int | None = None
        self.timer: threading.Timer | None = None
        self.strace: subprocess.Popen | None = None
        self.extra: subprocess.Popen | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, pred: Callable[[dict], bool], start: int = 0, timeout: float | None = None) -> dict | None:
        dl = self.deadline if timeout is None else min(self.deadline, time.monotonic() + timeout)
        return self.ev.wait(pred, dl, start, self.alive)

    def server_pid(self) -> int | None:
        e = self.wait(lambda e: e.get("event") == "online_start")
        return int(e["pid"]) if e else None

    def sleep_until(self, t_wall: float) -> None:
        d = t_wall - time.time()
        if d > 0:
            time.sleep(d)

    def missed(self, why: str) -> None:
        self.res.injected = False
        self.notes.append(f"fault not injected: {why}")

    # -- runner faults ----------------------------------------------------------------------------

    def _assignment(self, cycle: int, member: int) -> dict | None:
        return self.wait(lambda e: e.get("event") == "task_assign" and e.get("cycle") == cycle and e.get("member") == member)

    def runner_fault(self, sig: int, variant: str) -> None:
        r, h = self.res, self.h
        m = self.rng.randint(1, h.members)
        frac = self.rng.uniform(0.1, 0.8)
        stop = sig == signal.SIGSTOP
        pause = self.rng.uniform(1.5, 3.0) * h.heartbeat_timeout if stop and variant == "cont" else None
        r.where = f"cycle {r.cycle}, member {m}, {frac:.2f} x sleep into its forecast" + (
            f"; SIGCONT after {pause:.1f} s" if pause else "; left stopped" if stop else "")
        e = self._assignment(r.cycle, m)
        if e is None:
            return self.missed("the member was never assigned")
        self.sleep_until(float(e["t"]) + frac * h.sleep)
        pid = _pid_of(e["runner"])
        self.t_fault = time.time()
        if not _signal(pid, sig, "enkflow.online.models"):
            return self.missed(f"runner {e['runner']} is gone")
        self.victim_runner = str(e["runner"])
        r.hit = f"{signal.Signals(sig).name} runner {e['runner']} (task {e['task']})"
        if stop:
            self.stopped = pid
            if pause is not None:
                self.timer = threading.Timer(pause, lambda: _signal(pid, signal.SIGCONT, "enkflow.online.models"))
                self.timer.start()

    # -- server kills ------------------------------------------------------------------------------

    def _kill_server(self, pid: int) -> None:
        self.t_fault = time.time()
        if not _signal(pid, signal.SIGKILL, "enkflow.online.experiment"):
            return self.missed("the server is gone")
        self._snapshot()
        self.victim_server = pid

    def _snapshot(self) -> None:
        d = self.h.ckpt_dir
        for p in d.glob("forecast_*/member_*.rank_0000.h5"):
            self.snapshot.add((int(p.parent.name.split("_")[1]), int(p.name[7:11])))
        for p in d.glob("analysis_*.rank_0000.h5"):
            self.analyses.add(int(p.name[9:13]))

    def server_before_ckpt(self) -> None:
        r, h = self.res, self.h
        frac = self.rng.uniform(0.0, 0.8)
        r.where = f"cycle {r.cycle}, {frac:.2f} x sleep after its first assignment"
        pid = self.server_pid()
        e = self.wait(lambda e: e.get("event") == "task_assign" and e.get("cycle") == r.cycle)
        if pid is None or e is None:
            return self.missed("the cycle never started")
        self.sleep_until(float(e["t"]) + frac * h.sleep)
        self._kill_server(pid)
        done = sorted(m for c, m in self.snapshot if c == r.cycle)
        r.hit = f"SIGKILL server {pid}; checkpointed forecasts of cycle {r.cycle}: {done or 'none'}"

    def rank_fault(self, sig: int) -> None:
        """``sig`` to the server's last rank during cycle K's forecasts; the whole server goes (rank 0's
        tasks are the interrupted ones)."""
        r, h = self.res, self.h
        frac = self.rng.uniform(0.0, 0.8)
        r.where = f"cycle {r.cycle}, {frac:.2f} x sleep after its first assignment"
        pid = self.server_pid()
        e = self.wait(lambda e: e.get("event") == "task_assign" and e.get("cycle") == r.cycle)
        victim = _server_rank(h.root, h.ranks - 1)
        if pid is None or e is None or victim is None:
            return self.missed("the cycle never started")
        self.sleep_until(float(e["t"]) + frac * h.sleep)
        self.t_fault = time.time()
        if not _signal(victim, sig, "enkflow.online.experiment"):
            return self.missed("the server rank is gone")
        self._snapshot()
        self.victim_server = pid
        self.stopped = victim if sig == signal.SIGSTOP else None
        r.hit = f"{signal.Signals(sig).name} server rank {h.ranks - 1} ({victim}) of server {pid}"

    def server_after_ckpt(self) -> None:
        r, h = self.res, self.h
        j = self.rng.randint(1, max(1, h.members - 2))
        r.where = f"cycle {r.cycle}, once {j} forecasts are checkpointed"
        pid = self.server_pid()
        if pid is None:
            return self.missed("no server")
        d = h.ckpt_dir / f"forecast_{r.cycle:04d}"
        while self.alive() and time.monotonic() < self.deadline:
            try:
                if sum(1 for p in d.iterdir() if p.name.startswith("member_")) >= j:
                    break
            except FileNotFoundError:
                pass
            time.sleep(0.002)
        else:
            return self.missed("the checkpoints never appeared")
        self._kill_server(pid)
        done = sorted(m for c, m in self.snapshot if c == r.cycle)
        r.hit = f"SIGKILL server {pid}; {len(done)} checkpointed forecasts of cycle {r.cycle}: {done}"

    def server_analysis(self, point: str | None) -> None:
        r, h = self.res, self.h
        k = r.cycle
        choices = [p for p, (_, _, _, where) in ANALYSIS_POINTS.items()
                   if where == "any" or (where == "not-first" and k > 1) or (where == "last" and k == h.cycles)]
        if point is not None:
            if point not in ANALYSIS_POINTS or point not in choices:
                raise ValueError(f"kill point {point!r} does not exist in cycle {k} (choices: {choices})")
        else:
            point = self.rng.choice(choices)
        name, template, whens, _ = ANALYSIS_POINTS[point]
        when = self.rng.choice(whens)
        m = self.rng.randint(1, h.members)
        pid = self.server_pid()
        if pid is None:
            return self.missed("no server")
        from enkflow.experiment.config import load_experiment

        obs = load_experiment(h.toml).obs_path(k)
        path = template.format(obs=obs, run=h.run_dir, ckpt=h.ckpt_dir, root=h.root, cycle=k, prev=k - 1, m=m, pid=pid)
        r.where = f"cycle {k}: {point} ({name} #{when} of {os.path.relpath(path, h.root)})"
        log = h.root / "strace.log"
        self.strace = subprocess.Popen([h.strace, "-f", "-qq", "-o", str(log), "-e", f"trace={name}",
                                        "-e", f"inject={name}:signal=KILL:when={when}", "-P", path, "-p", str(pid)],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if not _wait_traced(pid, 20.0):
            return self.missed("strace did not attach: " + (self.strace.stderr.read(2000).decode(errors="replace")
                                                           if self.strace.poll() is not None else "timeout"))
        # Wait for the server to die (or the run to end: the point was not reached).
        while self.alive() and time.monotonic() < self.deadline and Path(f"/proc/{pid}").exists() \
                and "enkflow.online.experiment" in _cmdline(pid):
            time.sleep(0.002)
        self.t_fault = time.time()
        self._snapshot()
        try:
            self.strace.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        text = log.read_text(errors="replace") if log.exists() else ""
        if "+++ killed by SIGKILL +++" in text:
            self.victim_server = pid
            r.hit = f"strace SIGKILLed server {pid} entering {name} #{when}"
        else:
            self.t_fault = None
            self.snapshot.clear()
            self.missed(f"the kill point was not reached ({point})")

    # -- join and leave -----------------------------------------------------------------------------

    def _runner_argv(self, k: int) -> list[str]:
        from enkflow.experiment.config import load_experiment

        cfg = load_experiment(self.h.toml)
        odir = cfg.expdir / "online"
        values = {"address": (odir / "address").read_text().strip(), "token_file": odir / "token", "runner": k,
                  "expdir": cfg.expdir, "length": f"{cfg.experiment.forecast_length:g}", "steps": cfg.steps_per_cycle,
                  "restart": cfg.restart_path(1), "curve_key": ""}
        return [tok.format(**values) for tok in shlex.split(cfg.online.runner)]

    def join_leave(self) -> None:
        r, h = self.res, self.h
        delay = self.rng.uniform(0.0, 0.5) * h.sleep * h.members / h.runners
        frac = self.rng.uniform(0.1, 0.8)
        r.where = f"cycle {r.cycle}: a runner joins {delay:.2f} s after the first assignment; the next runner to " \
                  f"get a member leaves {frac:.2f} x sleep into its forecast"
        # Started now, joining later: its imports must not push the join past the end of the study.
        gate = h.root / f"extra-runner-{r.n}.json"
        gate.unlink(missing_ok=True)
        with open(h.root / "extra-runner.log", "ab") as log:
            self.extra = subprocess.Popen([h.python, str(Path(__file__).with_name("gated_start.py")), str(gate)],
                                          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=h.env,
                                          start_new_session=True)
        e = self.wait(lambda e: e.get("event") == "task_assign" and e.get("cycle") == r.cycle)
        if e is None:
            return self.missed("the cycle never started")
        self.sleep_until(float(e["t"]) + delay)
        argv = self._runner_argv(99)
        tmp = gate.with_suffix(".tmp")
        tmp.write_text(json.dumps(argv))
        os.replace(tmp, gate)
        name_end = f":{self.extra.pid}"
        j = self.wait(lambda e: e.get("event") == "runner_join" and str(e.get("runner", "")).endswith(name_end), timeout=30)
        if j is None:
            return self.missed("the extra runner did not join")
        idx = self.ev.all.index(j)
        a = self.wait(lambda e: e.get("event") == "task_assign" and not str(e.get("runner")).endswith(name_end), start=idx)
        if a is None:
            return self.missed("no member was assigned after the join")
        self.sleep_until(float(a["t"]) + frac * h.sleep)
        pid = _pid_of(a["runner"])
        self.t_fault = time.time()
        if not _signal(pid, signal.SIGTERM, "enkflow.online.models"):
            return self.missed(f"runner {a['runner']} is gone")
        self.victim_runner = str(a["runner"])
        starts = [e.get("cycle") for e in self.ev.all[:idx] if e.get("event") == "cycle_start"]
        joined = f"cycle {starts[-1]}" if starts else "before the first cycle"
        r.hit = f"runner {j['runner']} joined ({joined}); SIGTERM runner {a['runner']} (cycle {a['cycle']}, " \
                f"member {a['member']}, task {a['task']})"

    # -- the end ------------------------------------------------------------------------------------

    def cleanup(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer.join()
        if self.stopped is not None and _stopped(self.stopped) and "enkflow.online." in _cmdline(self.stopped):
            self.notes.append("the stopped process outlived the run")
            os.kill(self.stopped, signal.SIGKILL)
        if self.strace is not None and self.strace.poll() is None:
            self.strace.terminate()
            self.strace.wait()
        if self.extra is not None:
            try:
                rc = self.extra.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.extra.terminate()
                try:
                    rc = self.extra.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.extra.kill()
                    rc = self.extra.wait()
                self.notes.append(f"the extra runner did not stop by itself (exit {rc} after SIGTERM)")
            if rc != 0:
                self.notes.append(f"the extra runner exited {rc}")

    def account(self) -> None:
        """The trial's figures from the complete event log."""
        r, h = self.res, self.h
        evs = self.ev.all
        assigns = [e for e in evs if e.get("event") == "task_assign"]
        done = {(e.get("pid"), e.get("task")) for e in evs if e.get("event") == "task_done"}
        # The statelessness check's second run of a member ends with stateless_check, not task_done.
        for c in (e for e in evs if e.get("event") == "stateless_check" and e.get("ok")):
            runs = [e for e in assigns if e.get("pid") == c.get("pid") and e.get("cycle") == c.get("cycle")
                    and e.get("member") == c.get("member") and e["t"] <= c["t"] and (e.get("pid"), e.get("task")) not in done]
            if runs:
                done.add((runs[-1].get("pid"), runs[-1].get("task")))
        r.tasks = len(assigns)
        assert h.ref is not None
        r.recomputed = r.tasks - h.ref.tasks
        r.server_restarts = sum(e.get("event") == "server_crash" for e in evs)
        r.addresses = sorted({e.get("address") for e in evs if e.get("event") == "online_start"})
        for e in evs:
            if e.get("event") == "task_requeue":
                r.requeues[e.get("reason")] = r.requeues.get(e.get("reason"), 0) + 1
        if self.t_fault is None:
            return
        if self.victim_runner is not None:
            r.in_flight = sum(1 for e in assigns if e.get("runner") == self.victim_runner and e["t"] <= self.t_fault
                              and (e.get("pid"), e.get("task")) not in done)
            if r.scenario == "join-leave":
                left = [e for e in evs if e.get("event") in ("runner_leave", "runner_lost")
                        and e.get("runner") == self.victim_runner]
                r.clean_leave = bool(left) and left[0]["event"] == "runner_leave" and left[0].get("reason") == "left"
                if not r.clean_leave:
                    self.notes.append("the SIGTERMed runner did not leave cleanly: " + (
                        f"{left[0]['event']} ({left[0].get('reason')})" if left else "no leave event"))
        if self.victim_server is not None:
            pid = self.victim_server
            last = max(self.analyses, default=0)
            r.in_flight = sum(1 for e in assigns if e.get("pid") == pid and (pid, e.get("task")) not in done)
            accepted = {(e["cycle"], e["member"]) for e in evs if e.get("event") == "task_done" and e.get("pid") == pid}
            r.lost = sum(1 for c, m in accepted if c > last and (c, m) not in self.snapshot)
            open_cycle = {(c, m) for c, m in self.snapshot if c > last}
            r.checkpointed = len(open_cycle)
            r.redone_checkpointed = sorted({(e["cycle"], e["member"]) for e in assigns
                                            if e["t"] > self.t_fault and (e["cycle"], e["member"]) in open_cycle})
            starts = [e for e in evs if e.get("event") == "online_start" and e["t"] > self.t_fault]
            if starts:
                r.recovered = len(starts[0].get("recovered_forecasts") or [])
                first = (starts[0].get("cycles") or [None])[0]
                want = sorted(m for c, m in open_cycle if c == first)
                if sorted(starts[0].get("recovered_forecasts") or []) != want:
                    self.notes.append(f"the restarted server recovered {starts[0].get('recovered_forecasts')}, "
                                      f"checkpointed at the kill: {want}")
            elif r.rc == 0:
                self.notes.append("no server restart seen")


def _wait_traced(pid: int, timeout: float) -> bool:
    """True once every thread of ``pid`` has a tracer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
            ok = bool(tids)
            for tid in tids:
                for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
                    if line.startswith("TracerPid:") and line.split()[1] == "0":
                        ok = False
            if ok:
                return True
        except OSError:
            return False
        time.sleep(0.01)
    return False


# ---------------------------------------------------------------------------------------------
# Reporting


def format_table(results: Sequence[OnlineTrialResult]) -> str:
    """One line per trial (plus what was hit): scenario, moment, recomputed vs in flight, outcome."""
    lines = [f"{'#':>3}  {'scenario':<18} {'moment':<78} {'redo':>4} {'flight':>6} {'ckpt':>4} {'s':>5}  outcome"]
    for r in results:
        where = r.where if len(r.where) <= 78 else r.where[:75] + "..."
        flight = f"{r.in_flight}+{r.lost}" if r.lost else f"{r.in_flight}"
        ok = "" if r.recompute_ok else " REDO!"
        lines.append(f"{r.n:>3}  {r.scenario:<18} {where:<78} {r.recomputed:>4} {flight:>6} {r.checkpointed:>4} "
                     f"{r.seconds:>5.1f}  {r.outcome}{ok}{': ' + r.detail if r.detail else ''}")
        lines.append(f"{'':>5}hit: {r.hit or '-'}; requeues {r.requeues or '{}'}; server restarts {r.server_restarts}")
    return "\n".join(lines)


def summarize(results: Sequence[OnlineTrialResult]) -> dict:
    """Per scenario: trials, bitwise equal, faults injected as planned, recomputed (mean/max) vs in flight."""
    out: dict[str, dict] = {}
    for s in SCENARIOS:
        rs = [r for r in results if r.scenario == s]
        if not rs:
            continue
        red = [r.recomputed for r in rs]
        fl = [r.expected for r in rs]
        out[s] = {"trials": len(rs), "equal": sum(r.outcome == "equal" for r in rs),
                  "exit0": sum(r.rc == 0 for r in rs), "injected": sum(r.injected for r in rs),
                  "recomputed_mean": sum(red) / len(rs), "recomputed_max": max(red),
                  "in_flight_mean": sum(fl) / len(rs), "in_flight_max": max(fl),
                  "recompute_as_in_flight": sum(r.recompute_ok for r in rs),
                  "redone_checkpointed": sum(len(r.redone_checkpointed) for r in rs)}
    return out
