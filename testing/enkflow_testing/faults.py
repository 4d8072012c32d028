"""Fault injection for enkflow's crash-safety claim: "a kill at any moment, then a rerun, gives
restarts bitwise equal to the fault-free run".

Three tools, used by ``tests/test_fault_injection.py`` (short) and ``benchmarks/fault_trials.py``
(the full sweep):

1. **A syscall-level killer for the real analysis task.** :func:`injector_launcher` returns a
   prefix for ``[analysis_task] launcher``: this file run as a script (``strace-once``). On the
   first attempt of the chosen cycle's analysis only (a flag file, created exclusively, marks it;
   the job scheme's retry then runs clean) it starts ``strace`` attached to its own PID and then
   ``exec``'s the analysis, so the analysis keeps that PID: ``strace -f -qq -y -o LOG
   -e trace=FAMILY,execve [-e inject=NAME:signal=KILL:when=N] [-P PATH] -p PID``.
   strace delivers SIGKILL on *entering* the N-th call, and the kernel then skips the call, so
   "killed at call N" is the state just before call N. Without ``inject`` it only records every
   call of :data:`FAMILY` (the count run).

   How strace counts ``when=N`` (strace 6.1, checked here): *per syscall name and per tracee*
   (thread), and only over the calls that pass the ``-P`` path filter. ``inject=write,unlink:
   when=3`` is therefore not "the 3rd call of the set" but "the 3rd write or the 3rd unlink of
   any one thread, whichever comes first", and a member ``pwrite64`` done by an I/O thread can
   never be reached by counting the main thread's ``pwrite64``s. So the trials do not count a
   set: :func:`plan_injections` takes the count run's trace (every call of the family, in order)
   and, for each call, searches for a spec that selects exactly that call under strace's rule
   (simulated on the trace): one syscall name, optionally ``-P`` one of the call's paths (with
   the analysis' PID substituted: it is known in advance because the wrapper ``exec``'s; for a
   rename only its first path, strace 6.1 does not match ``-P`` against the new name), and
   ``when`` = the call's ordinal among the matching calls of its thread. ``--seccomp-bpf`` is not
   used: with it strace 6.1 skipped injections (seen here). Each trial's own trace then shows
   which call was really hit (``= ?`` followed by ``+++ killed by SIGKILL +++``), and the
   trial reports whether it is the planned one.

2. **Random kills of the driver, a pilot worker or the whole process tree**
   (:meth:`FaultHarness.kill_trial`): ``enkflow run`` in its own session, SIGKILL at a random
   moment (uniform over the fault-free run's duration, at a random point inside a cycle's
   analysis, or right after the analysis process exited, before its pilot confirmed it), then
   ``enkflow run`` again until it finishes (resume). The tree is frozen (SIGSTOP, repeated to
   catch children started meanwhile) and then killed, like a node failure.

3. **Bitwise comparison** with a fault-free reference run (:meth:`FaultHarness.reference`): every
   byte of every member restart; diagnostics say how many analysis attempts ran and whether the
   final analysis' background innovation RMS (``omb_rms``) is the reference's (a double
   analysis shows as the retry's ``omb_rms`` equal to the first attempt's ``oma_rms``).

Every trial runs in the same directory path (``WORK/trial`` or ``WORK/kill``, emptied before
each trial), so that the paths in the count run's trace (member files, commit marker, output
files) are the paths of every trial. Failed trials are moved to ``WORK/failed/``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: The system calls that change files (or their names, or durability): every one of them made by
#: the analysis task is a kill point. ``execve`` is traced as well (not injected) to mark where the
#: wrapper became the analysis.
FAMILY = (
    "write", "pwrite64", "writev", "pwritev", "pwritev2", "copy_file_range",
    "rename", "renameat", "renameat2", "unlink", "unlinkat", "link", "linkat",
    "fsync", "fdatasync", "sync_file_range", "msync",
    "ftruncate", "truncate", "fallocate",
)
FAULTS_PY = Path(__file__).resolve()
#: Placeholder for the analysis' PID in a ``-P`` path (braces are not allowed in a launcher).
PID_TOKEN = "%PID%"

_FD_CALLS = {"write", "pwrite64", "writev", "pwritev", "pwritev2", "fsync", "fdatasync", "sync_file_range",
             "ftruncate", "fallocate"}
_PATH_CALLS = {"rename", "unlink", "truncate", "link"}
_AT_CALLS = {"renameat", "renameat2", "unlinkat", "linkat"}
#: Names made of one update's or one object's random id (a shadow-file update's shadows and spares):
#: named alike in every trial, never a ``-P`` path (another trial names them otherwise).
_RANDOM_NAME = re.compile(r"(\.enkflow-(?:new|old)-)[0-9a-f-]+")


# ---------------------------------------------------------------------------------------------
# strace availability


def strace_path(install: bool = True) -> str | None:
    """strace's path; when absent and ``install`` and running as root with apt-get, install
    Debian's package first. None if it cannot be had."""
    found = shutil.which("strace")
    if found or not install:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return None
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "install", "-y", "-q", "strace"], ["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", "strace"]):
        try:
            subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if shutil.which("strace"):
            return shutil.which("strace")
    return shutil.which("strace")


def strace_missing_reason(install: bool = True) -> str | None:
    """Why syscall fault injection cannot run here (None when it can): no strace (and no way to
    install it), or ptrace not permitted (a container without CAP_SYS_PTRACE / seccomp)."""
    exe = strace_path(install)
    if exe is None:
        return "strace is not installed (Debian: apt-get install strace; needs root to install here)"
    try:
        r = subprocess.run([exe, "-f", "-qq", "-o", "/dev/null", "-e", "inject=getppid:error=ENOSYS", "true"],
                           capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"strace does not run: {exc}"
    if r.returncode != 0:
        return f"strace cannot trace here (ptrace not permitted?): {r.stderr.decode(errors='replace').strip()[:300]}"
    return None


# ---------------------------------------------------------------------------------------------
# The launcher wrapper (this file run as a script)


def injector_launcher(flag: str | Path, log: str | Path, *, cycle: int | None = None, inject: str | None = None,
                      when: int = 1, paths: Sequence[str] = (), python: str | None = None,
                      strace: str = "strace") -> str:
    """A prefix for ``[analysis_task] launcher`` that runs the analysis under strace once.

    The first attempt of ``cycle``'s analysis (every cycle's when None) creates ``flag`` and
    runs traced: with ``inject`` (a syscall name) SIGKILL on entering its ``when``-th call
    counted per thread over the calls touching one of ``paths`` (``-P``; ``%PID%`` stands for the
    analysis' PID), else only recording. Every other attempt runs the analysis directly.
    """
    argv = [python or sys.executable, str(FAULTS_PY), "strace-once", "--flag", str(flag), "--log", str(log),
            "--strace", strace]
    if cycle is not None:
        argv += ["--cycle", str(cycle)]
    if inject is not None:
        argv += ["--inject", inject, "--when", str(int(when))]
    for p in paths:
        argv += ["--path", p]
    return shlex.join(argv + ["--"])


def _wait_traced(tracer: subprocess.Popen, timeout: float = 20.0) -> bool:
    """Wait until ``tracer`` is this process' tracer (``TracerPid`` in /proc/self/status)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("TracerPid:"):
                    if int(line.split()[1]) == tracer.pid:
                        return True
                    break
        if tracer.poll() is not None:
            return False
        time.sleep(0.002)
    return False


def _wrapper_main(argv: list[str]) -> int:
    import argparse

    if "--" not in argv:
        print("faults.py strace-once: usage: ... -- COMMAND [ARGS]", file=sys.stderr)
        return 2
    i = argv.index("--")
    opts, cmd = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="faults.py strace-once")
    p.add_argument("--flag", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--strace", default="strace")
    p.add_argument("--cycle", type=int, default=None)
    p.add_argument("--inject", default=None)
    p.add_argument("--when", type=int, default=1)
    p.add_argument("--path", action="append", default=[])
    a = p.parse_args(opts)
    if not cmd:
        print("faults.py strace-once: no command", file=sys.stderr)
        return 2
    if a.cycle is not None and os.environ.get("ENKFLOW_CYCLE") != str(a.cycle):
        os.execvp(cmd[0], cmd)
    try:
        fd = os.open(a.flag, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        os.execvp(cmd[0], cmd)  # a retry: run clean
    pid = os.getpid()
    paths = [x.replace(PID_TOKEN, str(pid)) for x in a.path]
    with os.fdopen(fd, "w") as fh:
        json.dump({"pid": pid, "t": time.time(), "inject": a.inject, "when": a.when, "paths": paths, "cmd": cmd}, fh)
    try:  # Yama (if present) would refuse a child tracing its parent without this.
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(0x59616D61, ctypes.c_ulong(-1), 0, 0, 0)  # PR_SET_PTRACER, ANY
    except (OSError, AttributeError):
        pass
    sargv = [a.strace, "-f", "-qq", "-y", "-o", a.log, "-e", "trace=" + ",".join((*FAMILY, "execve"))]
    if a.inject:
        sargv += ["-e", f"inject={a.inject}:signal=KILL:when={a.when}"]
    if paths:  # the execve must show (it proves the tracing started before the analysis)
        paths.append(cmd[0] if os.sep in cmd[0] else (shutil.which(cmd[0]) or cmd[0]))
    for x in paths:
        sargv += ["-P", x]
    sargv += ["-p", str(pid)]
    with open(a.log + ".stderr", "wb") as err:
        tracer = subprocess.Popen(sargv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    if not _wait_traced(tracer):
        print(f"faults.py strace-once: strace did not attach (see {a.log}.stderr)", file=sys.stderr)
        return 125
    # The seize is done; let strace's interrupt stop this process and restart it with syscall
    # tracing before the analysis starts (the trace must show the execve, which is checked).
    time.sleep(0.2)
    os.execvp(cmd[0], cmd)
    return 127  # not reached


# ---------------------------------------------------------------------------------------------
# strace output


@dataclass(frozen=True)
class Call:
    """One system call of the traced family, in the order strace saw the calls enter."""

    index: int
    tid: int
    name: str
    args: str
    paths: tuple[str, ...]
    result: str | None  # None: never returned (the process died in it or before it)
    desc: str = ""  # set by describe_calls


_LINE = re.compile(r"^(\d+)\s+(.*)$")
_CALL = re.compile(r"^([a-z_0-9]+)\((.*)$")
_RESUMED = re.compile(r"^<\.\.\. ([a-z_0-9]+) resumed>(.*)$")
_STR = re.compile(r'"((?:[^"\\]|\\.)*)"')
_FD = re.compile(r"^\s*(-?\d+|AT_FDCWD)<([^>]*)>")


def _unescape(s: str) -> str:
    try:
        return s.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError:
        return s


def _call_paths(name: str, args: str) -> tuple[str, ...]:
    if name == "copy_file_range":  # from one descriptor into another: both
        return tuple(m.group(1) for m in re.finditer(r"-?\d+<([^>]*)>", args))
    if name in _FD_CALLS:
        m = _FD.match(args)
        return (m.group(2),) if m else ()
    if name in _PATH_CALLS:
        return tuple(_unescape(s) for s in _STR.findall(args))
    if name in _AT_CALLS:
        out = []
        for m in re.finditer(r'(-?\d+|AT_FDCWD)(?:<([^>]*)>)?,\s*"((?:[^"\\]|\\.)*)"', args):
            d, rel = m.group(2) or "", _unescape(m.group(3))
            out.append(rel if rel.startswith("/") or not d else os.path.join(d, rel))
        return tuple(out)
    return ()


def _result(tail: str) -> str | None:
    if tail.rstrip().endswith("<unfinished ...>"):
        return None
    if " = " not in tail:
        return None
    r = tail.rsplit(" = ", 1)[1].strip()
    return None if r.startswith("?") else r


@dataclass
class Trace:
    """A parsed strace log: the analysis' calls of :data:`FAMILY` after its ``execve``."""

    calls: list[Call]
    pid: int | None
    killed: set[int]  # tracees killed by SIGKILL
    exec_seen: bool
    children: set[int] = field(default_factory=set)  # tracees that are other processes (they exec'd)
    text: str = ""

    def hits(self) -> list[Call]:
        """The calls a SIGKILL stopped: those that never returned, in tracees that were killed."""
        return [c for c in self.calls if c.result is None and c.tid in self.killed]


def parse_strace(text: str, pid: int | None = None) -> Trace:
    """Parse ``strace -f -y -o`` output (one file, lines ``TID call(args) = result``, split into
    ``<unfinished ...>`` / ``<... call resumed>`` when tracees interleave). Calls before the first
    ``execve`` of ``pid`` (the wrapper's own) are dropped."""
    calls: list[dict] = []
    open_by_tid: dict[int, dict] = {}
    killed: set[int] = set()
    children: set[int] = set()
    exec_seen = pid is None
    for raw in text.splitlines():
        m = _LINE.match(raw)
        if not m:
            continue
        tid, rest = int(m.group(1)), m.group(2)
        if rest.startswith("+++ killed by SIGKILL"):
            killed.add(tid)
            continue
        if rest.startswith(("+++", "---")):
            continue
        r = _RESUMED.match(rest)
        if r:
            c = open_by_tid.pop(tid, None)
            if c is not None and c["name"] == r.group(1):
                c["result"] = _result(r.group(2))
            continue
        cm = _CALL.match(rest)
        if not cm:
            continue
        name, args = cm.group(1), cm.group(2)
        if name == "execve":
            if tid == pid:
                exec_seen = True
            else:
                children.add(tid)
            continue
        if not exec_seen or name not in FAMILY:
            continue
        c = {"tid": tid, "name": name, "args": args, "paths": _call_paths(name, args), "result": _result(args)}
        if args.rstrip().endswith("<unfinished ...>"):
            open_by_tid[tid] = c
        calls.append(c)
    out = [Call(i, c["tid"], c["name"], c["args"][:200], c["paths"], c["result"]) for i, c in enumerate(calls)]
    return Trace(out, pid, killed, exec_seen, children, text)


def parse_summary(text: str) -> dict[str, int]:
    """``strace -c`` table -> calls per syscall name."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] not in ("total",):
            try:
                out[parts[-1]] = int(parts[3])
            except ValueError:
                continue
    return out


def ensemble_key(paths: Sequence[str | Path]) -> str:
    """enkflow.io.wal's name for one ensemble (sha1 of the absolute paths): it appears in the
    commit marker's and the logs' file names."""
    return hashlib.sha1("\n".join(os.path.abspath(p) for p in paths).encode()).hexdigest()[:16]


def wal_logs(paths: Sequence[str | Path]) -> list[Path]:
    """The write-ahead logs of the ensemble of member files ``paths``, in their default place
    (``.enkflow-wal/`` beside the first) and in ``/dev/shm`` (where a configuration may put them)."""
    key = ensemble_key(paths)
    places = (Path(os.path.abspath(paths[0])).parent / ".enkflow-wal", Path("/dev/shm"))
    return sorted(p for d in places for p in d.glob(f"enkflow-wal-{key}-*"))


def shadow_files(paths: Sequence[str | Path]) -> list[Path]:
    """The shadows and spares of a shadow-file update of the member files ``paths`` (beside each)."""
    return sorted(q for p in map(Path, paths) for q in p.parent.glob(f".{p.name}.enkflow-[no][el][wd]-*"))


def _sub_pid(s: str, pid: int, token: str) -> str:
    return re.sub(rf"(?<!\d){pid}(?!\d)", token, s)


def normalize(path: str, *, root: str | Path | None, pid: int | None, key: str | None) -> str:
    """A path as it reads in every trial: relative to the trial root, with the ensemble key, the
    analysis' PID and long numbers (thread identifiers, pipe inodes) replaced by names."""
    s = path
    if key:
        s = s.replace(key, "<key>")
    if root:
        s = s.replace(str(root).rstrip("/") + "/", "")
    if pid:
        s = _sub_pid(s, pid, "<pid>")
    s = re.sub(r"(pipe|socket|anon_inode):\[\d+\]", r"\1", s)
    s = _RANDOM_NAME.sub(r"\1<id>", s)
    s = re.sub(r"\d{9,}", "<n>", s)
    return s


def describe_calls(calls: list[Call], *, root: str | Path | None, pid: int | None, key: str | None) -> list[Call]:
    """Give every call a trial-independent name: ``NAME PATH[ -> PATH2] #k`` (k-th such call)."""
    seen: dict[str, int] = {}
    out = []
    for c in calls:
        ps = [normalize(p, root=root, pid=pid, key=key) for p in c.paths]
        base = c.name + (" " + " -> ".join(ps) if ps else "")
        seen[base] = seen.get(base, 0) + 1
        out.append(dataclasses.replace(c, desc=f"{base} #{seen[base]}"))
    return out


# ---------------------------------------------------------------------------------------------
# Planning one kill per call


@dataclass(frozen=True)
class Injection:
    """Kill on entering the ``when``-th call ``name`` of a thread (counting the calls touching
    ``path`` if given), planned to hit ``target`` (a call of the count run). ``expected``: every
    call strace's rule would kill in the count run (a kill in a helper process, e.g. ``uname``,
    does not stop the analysis, which then dies at its own ``when``-th call)."""

    target: Call
    name: str
    when: int
    path: str | None  # template with PID_TOKEN
    expected: tuple[str, ...]  # descriptions of the predicted kills, in order

    @property
    def exact(self) -> bool:
        """The first kill strace's rule makes in the count run is ``target``."""
        return bool(self.expected) and self.expected[0] == self.target.desc

    @property
    def spec(self) -> str:
        p = f" -P {self.path}" if self.path else ""
        return f"inject={self.name}:signal=KILL:when={self.when}{p}"


def touches(c: Call, path: str) -> bool:
    """Whether strace's ``-P path`` selects call ``c``: for the rename family only the *first*
    path counts (strace 6.1 ignores the new name: checked here), for the others any path."""
    if c.name in ("rename", "renameat", "renameat2"):
        return bool(c.paths) and c.paths[0] == path
    return path in c.paths


def predict(calls: Sequence[Call], name: str, path: str | None, when: int, children: set[int] = frozenset()) -> list[Call]:
    """The calls strace's ``inject=NAME:signal=KILL:when=WHEN [-P PATH]`` kills in a run making
    ``calls``: counted per thread over the calls of that name touching the path; a kill in one of
    ``children`` (other processes) ends that process only, any other ends the analysis."""
    counts: dict[int, int] = {}
    dead: set[int] = set()
    out = []
    for c in calls:
        if c.tid in dead or c.name != name or (path is not None and not touches(c, path)):
            continue
        counts[c.tid] = counts.get(c.tid, 0) + 1
        if counts[c.tid] == when:
            out.append(c)
            if c.tid not in children:
                break
            dead.add(c.tid)
    return out


def _stable(path: str) -> bool:
    return path.startswith("/") and not re.search(r"\d{9,}", path) and not _RANDOM_NAME.search(path)


def plan_injections(trace: Trace) -> list[Injection]:
    """One injection per call of ``trace`` (in order), exact where strace's counting allows:
    candidates are the call's name with ``-P`` each stable path of it (the analysis' PID becomes
    ``%PID%``), then the name alone; the first whose predicted first kill is the call wins."""
    pid = trace.pid
    out = []
    for c in trace.calls:
        cands: list[tuple[str | None, str | None]] = []  # (path template, path as in this trace)
        for p in c.paths:
            if _stable(p) and touches(c, p):
                cands.append((_sub_pid(p, pid, PID_TOKEN) if pid else p, p))
        cands.append((None, None))
        best = None
        for tmpl, real in cands:
            when = sum(1 for d in trace.calls[: c.index + 1]
                       if d.tid == c.tid and d.name == c.name and (real is None or touches(d, real)))
            kills = predict(trace.calls, c.name, real, when, trace.children)
            inj = Injection(c, c.name, when, tmpl, tuple(k.desc for k in kills))
            if inj.exact:
                best = inj
                break
            best = best or inj
        out.append(best)  # type: ignore[arg-type]
    return out


# ---------------------------------------------------------------------------------------------
# Processes


def procs_of(root: str | Path) -> list:
    """Live processes whose command line mentions ``root`` (a trial's driver, pilots, models,
    analysis, strace)."""
    import psutil

    key = str(root)
    me = os.getpid()
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.pid == me or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = p.info["cmdline"] or []
            if any(key in a for a in cmd):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def _is(kind: str, cmd: list[str]) -> bool:
    s = " ".join(cmd)
    if kind == "pilot":
        return "-m enkflow.jobs " in s + " " or "enkflow worker" in s
    if kind == "analysis":
        return "enkflow.experiment.analysis_task" in s and "strace-once" not in s and not s.startswith("strace")
    if kind == "model":
        return "enkflow.cli.model" in s
    raise ValueError(kind)


def find(kind: str, root: str | Path) -> list:
    """This trial's processes of one kind: ``pilot``, ``analysis`` or ``model``."""
    out = []
    for p in procs_of(root):
        try:
            if _is(kind, p.cmdline()):
                out.append(p)
        except Exception:  # noqa: BLE001 - gone meanwhile
            continue
    return out


def kill_tree(pid: int, root: str | Path | None = None, first: Sequence[int] = ()) -> int:
    """SIGKILL ``pid``, all its descendants and (with ``root``) every process of that trial, at
    once: everything is stopped first (SIGSTOP; ``first`` before anything else, then three rounds
    for children started meanwhile), then killed, like a node failure. Returns the number of
    processes killed."""
    import psutil

    frozen: dict[int, object] = {}
    for q in first:
        try:
            os.kill(q, signal.SIGSTOP)
            frozen[q] = psutil.Process(q)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    for _ in range(3):
        cand = []
        try:
            top = psutil.Process(pid)
            cand = [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
        if root is not None:
            cand += procs_of(root)
        for q in cand:
            if q.pid in frozen:
                continue
            try:
                q.suspend()
                frozen[q.pid] = q
            except psutil.NoSuchProcess:
                continue
    n = 0
    for q in frozen.values():
        try:
            q.kill()  # type: ignore[attr-defined]
            n += 1
        except psutil.NoSuchProcess:
            continue
    return n


def wait_gone(root: str | Path, timeout: float) -> list[str]:
    """Wait until no process of the trial is left; kill the stragglers after ``timeout``;
    returns their command lines (should be empty)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not procs_of(root):
            return []
        time.sleep(0.1)
    left = []
    for p in procs_of(root):
        try:
            left.append(" ".join(p.cmdline())[:160])
            p.kill()
        except Exception:  # noqa: BLE001
            continue
    return left


# ---------------------------------------------------------------------------------------------
# Trials


@dataclass
class TrialResult:
    n: int
    kind: str  # syscall | driver | pilot | tree
    where: str  # the planned kill point / the moment
    outcome: str  # equal | differs | error
    detail: str = ""
    seconds: float = 0.0
    hit: str = ""  # what was actually killed
    exact: bool | None = None  # syscall trials: the hit is the planned call
    attempts: dict[int, int] = field(default_factory=dict)  # analysis attempts per cycle
    omb_ok: bool | None = None  # every cycle's final omb_rms equals the reference's
    runs: int = 1  # enkflow run invocations (1 + resumes)
    call: int | None = None  # syscall trials: index of the planned call in the count run

    def row(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Reference:
    restarts: list[bytes]
    seconds: float
    omb: dict[int, float]
    analysis_s: dict[int, float]


def _events(expdir: Path) -> list[dict]:
    out = []
    try:
        with open(expdir / "events.jsonl") as fh:
            for line in fh:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except FileNotFoundError:
        pass
    return out


class FaultHarness:
    """Fault trials of one small experiment with the built-in analysis.

    ``work`` holds the synthetic problem, the reference run, the trial directories and failed
    trials. ``env`` is the environment of every ``enkflow run`` (e.g. ``PYTHONPATH`` of another
    checkout's ``src`` to test that code). Call :meth:`reference` first.
    """

    def __init__(self, work: str | Path, *, members: int = 4, cycles: int = 2, workers: int = 2,
                 env: dict[str, str] | None = None, python: str | None = None, run_timeout: float = 180.0,
                 keep_failed: bool = True, say: Callable[[str], None] | None = None):
        from enkflow_testing.experiments import synth_problem

        self.work = Path(work).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.members, self.cycles, self.workers = members, cycles, workers
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("OMP_NUM_THREADS", "1")
        self.env.setdefault("OPENBLAS_NUM_THREADS", "1")
        self.python = python or sys.executable
        self.run_timeout = run_timeout
        self.keep_failed = keep_failed
        self.say = say or (lambda _m: None)
        self.synth = synth_problem(self.work / "synth", members)
        self.ref: Reference | None = None
        self.trial_root = self.work / "trial"
        self.kill_root = self.work / "kill"
        self.strace = strace_path(install=False) or "strace"

    # -- experiments ------------------------------------------------------------------------

    def _fresh(self, root: Path, launcher: str = "") -> Path:
        from enkflow_testing.experiments import write_builtin_experiment

        left = wait_gone(root, 10.0) if root.exists() else []
        if left:
            self.say(f"  (killed {len(left)} leftover processes of {root.name})")
        if root.exists():
            shutil.rmtree(root)
        self._clean_wal(root)
        return write_builtin_experiment(root, self.synth, members=self.members, cycles=self.cycles,
                                        workers=self.workers, analysis_launcher=launcher, python=self.python)

    def _wal_logs(self, root: Path) -> list[Path]:
        from enkflow_testing.experiments import restart_paths

        return wal_logs(restart_paths(root, self.members))

    def _clean_wal(self, root: Path) -> None:
        """Remove write-ahead logs this trial directory's ensemble left (a committed
        update's log is consumed by recovery; an uncommitted one would be removed as stale by the
        next update, but the next trial may not get that far before a kill)."""
        for p in self._wal_logs(root):
            try:
                p.unlink()
            except OSError:
                pass

    def _start(self, toml: Path, log: Path):
        fh = open(log, "ab")
        try:
            return subprocess.Popen([self.python, "-m", "enkflow", "run", str(toml)], stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=self.env, start_new_session=True, cwd=toml.parent)
        finally:
            fh.close()

    def _run(self, toml: Path, log: Path) -> int:
        p = self._start(toml, log)
        try:
            return p.wait(timeout=self.run_timeout)
        except subprocess.TimeoutExpired:
            kill_tree(p.pid, toml.parent)
            p.wait()
            return 124

    def _finish(self, root: Path, toml: Path, first_rc: int | None, max_runs: int = 4) -> tuple[int, int]:
        """Rerun ``enkflow run`` until it succeeds (resume); returns (last rc, invocations)."""
        rc, runs = first_rc, 1
        while rc != 0 and runs < max_runs:
            runs += 1
            rc = self._run(toml, root / f"driver.{runs}.log")
        return (rc if rc is not None else -1), runs

    def _stats(self, root: Path) -> tuple[dict[int, int], dict[int, float], dict[int, float]]:
        """Analysis attempts, final omb_rms and analysis run_s per cycle, from events.jsonl."""
        aid = self.members + 1
        attempts: dict[int, int] = {}
        omb: dict[int, float] = {}
        run_s: dict[int, float] = {}
        for e in _events(root / "exp"):
            if e.get("task") != aid:
                continue
            if e.get("event") == "task_start":
                attempts[e["cycle"]] = attempts.get(e["cycle"], 0) + 1
            elif e.get("event") == "task_end":
                t = e.get("timings", {})
                if "omb_rms" in t:
                    omb[e["cycle"]] = float(t["omb_rms"])
                run_s[e["cycle"]] = float(e.get("run_s", 0.0))
        return attempts, omb, run_s

    def reference(self) -> Reference:
        """The fault-free run (also warms the caches: .pyc, numba): restarts and diagnostics."""
        from enkflow_testing.experiments import restart_bytes

        root = self.work / "ref"
        toml = self._fresh(root)
        t0 = time.perf_counter()
        rc = self._run(toml, root / "driver.1.log")
        secs = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"the fault-free reference run failed (exit {rc}); see {root}/driver.1.log and {root}/exp")
        _, omb, run_s = self._stats(root)
        self.ref = Reference(restart_bytes(root, self.members), secs, omb, run_s)
        return self.ref

    def _compare(self, root: Path) -> tuple[str, str]:
        from enkflow_testing.experiments import restart_bytes

        assert self.ref is not None, "run reference() first"
        try:
            got = restart_bytes(root, self.members)
        except OSError as exc:
            return "error", f"restarts unreadable: {exc}"
        bad = [m for m, (a, b) in enumerate(zip(got, self.ref.restarts), start=1) if a != b]
        if bad:
            return "differs", "members " + ",".join(map(str, bad)) + " differ"
        return "equal", ""

    def _conclude(self, res: TrialResult, root: Path, rc: int, runs: int, t0: float) -> TrialResult:
        assert self.ref is not None
        left = wait_gone(root, 20.0)
        res.runs = runs
        res.attempts, omb, _ = self._stats(root)
        res.omb_ok = all(omb.get(k) == v for k, v in self.ref.omb.items())
        if rc != 0:
            res.outcome, res.detail = "error", f"enkflow run exit {rc} after {runs} run(s)"
        else:
            res.outcome, res.detail = self._compare(root)
        if left:
            res.detail = (res.detail + "; " if res.detail else "") + f"{len(left)} processes left running"
        from enkflow_testing.experiments import restart_paths

        logs = self._wal_logs(root) + shadow_files(restart_paths(root, self.members))
        if logs:  # a finished experiment leaves no write-ahead log, shadow or spare behind (disk and tier space)
            res.detail = (res.detail + "; " if res.detail else "") + f"{len(logs)} logs or shadows left: {logs[0]}"
        res.seconds = time.perf_counter() - t0
        if res.outcome != "equal" and self.keep_failed:
            dest = self.work / "failed" / f"{res.n:03d}-{res.kind}"
            if dest.exists():
                shutil.rmtree(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(root, dest, symlinks=True)
            res.detail += f" (kept in {dest})"
        return res

    # -- syscall trials -----------------------------------------------------------------------

    def trace(self, cycle: int, *, summary: bool = False) -> Trace:
        """A fault-free run whose ``cycle`` analysis runs traced: its calls of the family, in
        order (also checks that tracing alone leaves the result bitwise equal)."""
        root = self.trial_root
        flag, log = root / "inject.flag", root / "strace.log"
        toml = self._fresh(root, injector_launcher(flag, log, cycle=cycle, python=self.python, strace=self.strace))
        rc = self._run(toml, root / "driver.1.log")
        if rc != 0:
            raise RuntimeError(f"the traced fault-free run failed (exit {rc}); see {root}")
        outcome, detail = self._compare(root)
        if outcome != "equal":
            raise RuntimeError(f"tracing alone changed the result: {detail}; see {root}")
        info = json.loads(flag.read_text())
        tr = parse_strace(log.read_text(), info["pid"])
        if not tr.exec_seen:
            raise RuntimeError(f"strace did not see the analysis start; see {log}")
        key = ensemble_key([str(root / "members" / f"member_{m:04d}.nc") for m in range(1, self.members + 1)])
        tr.calls = describe_calls(tr.calls, root=root, pid=tr.pid, key=key)
        wait_gone(root, 10.0)
        return tr

    def syscall_trial(self, n: int, inj: Injection, cycle: int) -> TrialResult:
        """Kill ``cycle``'s analysis as ``inj`` plans, let the job scheme retry, compare."""
        root = self.trial_root
        flag, log = root / "inject.flag", root / "strace.log"
        t0 = time.perf_counter()
        launcher = injector_launcher(flag, log, cycle=cycle, inject=inj.name, when=inj.when,
                                     paths=[inj.path] if inj.path else [], python=self.python, strace=self.strace)
        toml = self._fresh(root, launcher)
        res = TrialResult(n, "syscall", inj.target.desc, "error", call=inj.target.index)
        rc = self._run(toml, root / "driver.1.log")
        rc, runs = self._finish(root, toml, rc)
        try:
            info = json.loads(flag.read_text())
            tr = parse_strace(log.read_text(), info["pid"])
            key = ensemble_key([str(root / "members" / f"member_{m:04d}.nc") for m in range(1, self.members + 1)])
            tr.calls = describe_calls(tr.calls, root=root, pid=tr.pid, key=key)
            hits = [c.desc for c in tr.hits()]
            if not tr.exec_seen:
                res.hit = "(strace missed the start)"
            elif not hits:
                res.hit = "(not reached: ran to the end)" if not tr.killed else "(killed, call not identified)"
            else:
                res.hit = " + ".join(hits)
            res.exact = tr.exec_seen and inj.target.desc in hits
        except (OSError, ValueError) as exc:
            res.hit, res.exact = f"(no trace: {exc})", False
        return self._conclude(res, root, rc, runs, t0)

    # -- random kills ---------------------------------------------------------------------------

    def kill_trial(self, n: int, target: str, moment: str, rng: random.Random, *, cycle: int | None = None) -> TrialResult:
        """SIGKILL ``target`` (``driver``, ``pilot`` or ``tree``) at a random ``moment``:

        * ``time``: uniform over the reference run's duration;
        * ``analysis``: uniform within ``cycle``'s analysis (its reference run time), from the
          moment its process appears;
        * ``after-analysis``: as soon as ``cycle``'s analysis process has exited (zombie), before
          its pilot confirmed it (for ``pilot``: that pilot).

        then rerun ``enkflow run`` until it finishes, and compare.
        """
        import psutil

        assert self.ref is not None, "run reference() first"
        root = self.kill_root
        toml = self._fresh(root)
        cycle = cycle or rng.randint(1, self.cycles)
        t0 = time.perf_counter()
        drv = self._start(toml, root / "driver.1.log")
        res = TrialResult(n, target, moment if moment == "time" else f"{moment} (cycle {cycle})", "error")
        victim: int | None = None
        how = ""
        deadline = time.monotonic() + self.run_timeout
        pilot: int | None = None
        if moment == "time":
            delay = rng.uniform(0.05, max(0.1, 0.9 * self.ref.seconds))
            time.sleep(delay)
            how = f"t={delay:.2f}s"
            res.where = f"time {delay:.2f}s of {self.ref.seconds:.1f}s"
        else:
            an = None
            while an is None and time.monotonic() < deadline and drv.poll() is None:
                for p in find("analysis", root):
                    try:
                        if p.cmdline()[-1] == str(cycle):
                            an = p
                            break
                    except psutil.NoSuchProcess:
                        continue
                else:
                    time.sleep(0.005)
            if an is None:
                how = "analysis never seen"
            else:
                try:
                    parent = an.parent()
                    pilot = parent.pid if parent is not None else None
                except psutil.NoSuchProcess:
                    pilot = None
                if moment == "analysis":
                    span = self.ref.analysis_s.get(cycle, 0.5)
                    delay = rng.uniform(0.0, span)
                    time.sleep(delay)
                    how = f"{delay:.2f}s into the analysis (ref {span:.2f}s)"
                else:  # after-analysis
                    while time.monotonic() < deadline:
                        try:
                            if an.status() == psutil.STATUS_ZOMBIE:
                                break
                        except psutil.NoSuchProcess:
                            break
                        time.sleep(0.001)
                    how = "analysis exited"
                if target == "pilot":
                    victim = pilot
                    if victim is not None and moment == "after-analysis":
                        try:  # before anything else: the pilot confirms within milliseconds
                            os.kill(victim, signal.SIGKILL)
                            res.hit = f"pilot {victim} killed ({how})"
                        except ProcessLookupError:
                            res.hit = f"pilot already gone ({how})"
        if res.hit:
            pass
        elif drv.poll() is not None:
            res.hit = f"(the run had finished before the kill: no fault; {how})"
        elif target == "driver":
            victim = drv.pid
            try:
                os.kill(drv.pid, signal.SIGKILL)
                res.hit = f"driver killed ({how})"
            except ProcessLookupError:
                res.hit = f"driver already gone ({how})"
        elif target == "tree":
            k = kill_tree(drv.pid, root, first=[pilot] if pilot and moment == "after-analysis" else [])
            res.hit = f"{k} processes killed ({how})"
        elif target == "pilot":
            if victim is None:
                t_end = time.monotonic() + 5.0
                while victim is None and time.monotonic() < t_end:
                    pilots = find("pilot", root)
                    if pilots:
                        victim = rng.choice(pilots).pid
                    else:
                        time.sleep(0.01)
            if victim is None:
                res.hit = f"no pilot alive ({how})"
            else:
                try:
                    os.kill(victim, signal.SIGKILL)
                    res.hit = f"pilot {victim} killed ({how})"
                except ProcessLookupError:
                    res.hit = f"pilot already gone ({how})"
        else:
            raise ValueError(target)
        try:
            rc = drv.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_tree(drv.pid, root)
            rc = drv.wait()
        rc, runs = self._finish(root, toml, rc)
        return self._conclude(res, root, rc, runs, t0)


# ---------------------------------------------------------------------------------------------
# Reporting


def format_table(results: Sequence[TrialResult]) -> str:
    """One line per trial: number, kind, planned kill point / moment, what was hit, outcome."""
    lines = [f"{'#':>3}  {'kind':<7} {'kill point':<72} {'hit':<6} {'attempts':<8} {'omb':<4} {'runs':>4} {'s':>5}  outcome"]
    for r in results:
        hit = "" if r.exact is None else ("yes" if r.exact else "NO")
        att = ",".join(f"{v}" for _, v in sorted(r.attempts.items()))
        omb = "" if r.omb_ok is None else ("ok" if r.omb_ok else "DIFF")
        where = r.where if r.call is None else f"[{r.call}] {r.where}"
        where = where if len(where) <= 72 else where[:30] + "..." + where[-39:]
        lines.append(f"{r.n:>3}  {r.kind:<7} {where:<72} {hit:<6} {att:<8} {omb:<4} {r.runs:>4} {r.seconds:>5.1f}  "
                     f"{r.outcome}{': ' + r.detail if r.detail else ''}")
        if r.kind != "syscall" or r.hit != r.where:
            lines.append(f"{'':>14}hit: {r.hit}")
    return "\n".join(lines)


def summary_line(results: Sequence[TrialResult]) -> str:
    n = len(results)
    eq = sum(r.outcome == "equal" for r in results)
    df = sum(r.outcome == "differs" for r in results)
    er = sum(r.outcome == "error" for r in results)
    return f"{n} trials: {eq} bitwise equal, {df} differ, {er} errors"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "strace-once":
        sys.exit(_wrapper_main(sys.argv[2:]))
    print("usage: faults.py strace-once --flag F --log L [--cycle C] [--inject NAME --when N] [--path P]... -- CMD...",
          file=sys.stderr)
    sys.exit(2)
