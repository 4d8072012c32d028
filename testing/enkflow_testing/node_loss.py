"""Node-loss trials on the emulated cluster (``benchmarks/node_loss_trials.py``, issue 22 acceptance 2).

Each trial copies the same prepared study (:mod:`enkflow_testing.node_loss_study`) to the same folder,
starts ``enkflow run`` on login node ``l1`` (SLURM launcher), injects one fault at a random moment drawn
uniformly over the fault-free run's duration (seeded), lets the study complete (the same ``enkflow run``;
a rerun when the launcher itself was lost: from ``l2`` when ``l1`` is gone) and compares the final
restarts and analysis files with the fault-free run's. Then it records what the study left on the live
nodes (processes naming the study folder, ``/dev/shm`` names), waiting up to ``grace_s`` for them to go,
removes them, cancels every SLURM job and revives the lost node.

``recomputed``: forecasts started beyond the fault-free run's (offline ``task_start`` of a member, online
``task_assign``); ``in_flight``: forecasts started before the fault and not finished, read from the
events right after it (a node of runners or pilots: only those on that node); the target is
``recomputed <= in_flight``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from enkflow_testing.analysis_barrier import AnalysisBarrier, Phase, phase
from enkflow_testing.cluster_ns import ClusterUnavailable, delete_netns
from enkflow_testing.node_loss_study import (TOML, Mode, events, fresh_copy, offline_toml, online_toml, outputs,
                                             prepare, shm_segments, study_pids, study_processes)

if TYPE_CHECKING:
    from enkflow_testing.cluster import Cluster

LAUNCHER_NODE, SPARE_LOGIN = "l1", "l2"


class Scenario(StrEnum):
    ONLINE_SERVER_NODE = "online-server-node"
    ONLINE_RUNNER_NODE = "online-runner-node"
    ONLINE_LAUNCHER_NODE = "online-launcher-node"
    ONLINE_KILL_RUN = "online-kill-run"
    OFFLINE_ANALYSIS_BEFORE = "offline-analysis-node-before-commit"
    OFFLINE_ANALYSIS_AFTER = "offline-analysis-node-after-commit"
    OFFLINE_PILOT_NODE = "offline-pilot-node"
    OFFLINE_KILL_RUN = "offline-kill-run"

    @property
    def mode(self) -> Mode:
        return Mode.ONLINE if self.value.startswith("online") else Mode.OFFLINE

    @property
    def loses_launcher(self) -> bool:
        return self in (Scenario.ONLINE_LAUNCHER_NODE, Scenario.ONLINE_KILL_RUN, Scenario.OFFLINE_KILL_RUN)


#: The phase of the analysis's update an analysis scenario means to lose its node in.
TARGET_PHASE = {Scenario.OFFLINE_ANALYSIS_BEFORE: Phase.BEFORE_COMMIT, Scenario.OFFLINE_ANALYSIS_AFTER: Phase.COMMITTED}


@dataclass
class Reference:
    """The fault-free run on the cluster: its outputs, wall seconds, forecasts started and (offline) the
    seconds of each cycle's analysis task."""

    outputs: dict[str, bytes]
    seconds: float
    forecasts: int
    analysis_s: dict[int, float]


@dataclass
class TrialResult:
    scenario: str
    n: int
    at_s: float = 0.0  # planned moment, seconds after the start
    fault: str = ""  # what was done
    injected: bool = False
    on_target: bool = True  # analysis scenarios: the kill came in the phase the scenario names
    completed: bool = False  # the (last) enkflow run exited 0
    rc: list[int | None] = field(default_factory=list)  # exit status of each enkflow run
    equal: bool = False
    left_processes: dict[str, list[str]] = field(default_factory=dict)
    left_shm: dict[str, list[str]] = field(default_factory=dict)
    left_wal: list[str] = field(default_factory=list)  # write-ahead logs, shadows, spares, commit markers beside the members
    gone_after_s: float = 0.0  # how long the study's leftovers took to go (0: none at the run's end)
    recomputed: int = 0
    in_flight: int = 0
    seconds: float = 0.0
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.completed and self.equal and not (self.left_processes or self.left_shm or self.left_wal)

    def row(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def _forecasts(evs: list[dict], mode: Mode) -> int:
    if mode is Mode.OFFLINE:
        return sum(e.get("event") == "task_start" and e.get("member") is not None for e in evs)
    return sum(e.get("event") == "task_assign" for e in evs)


def in_flight(evs: list[dict], mode: Mode, t_fault: float, host: str | None = None) -> int:
    """Forecasts started by the time ``t_fault`` (epoch seconds) and not finished in the events ``evs``, read
    after the fault (only those running on ``host`` if given: offline a pilot's ``worker`` is ``HOST-PID``,
    online a runner is ``HOST:PID``). Online, the statelessness check's repeat run of a member ends with
    ``stateless_check`` instead of ``task_done``."""
    if mode is Mode.OFFLINE:
        started = {(e.get("worker"), e.get("cycle"), e.get("task")): str(e.get("worker")).rsplit("-", 1)[0]
                   for e in evs if e.get("event") == "task_start" and e.get("member") is not None and e["t"] <= t_fault}
        ended = {(e.get("worker"), e.get("cycle"), e.get("task")) for e in evs if e.get("event") == "task_end"}
        return sum(k not in ended and host in (None, h) for k, h in started.items())
    assigns = [e for e in evs if e.get("event") == "task_assign"]
    ended = {(e.get("pid"), e.get("task")) for e in evs if e.get("event") == "task_done"}
    for check in (e for e in evs if e.get("event") == "stateless_check"):
        runs = [a for a in assigns if (a.get("pid"), a.get("cycle"), a.get("member")) ==
                (check.get("pid"), check.get("cycle"), check.get("member")) and a["t"] <= check["t"]]
        ended |= {(runs[-1].get("pid"), runs[-1].get("task"))} if runs else set()
    return sum((a.get("pid"), a.get("task")) not in ended and a["t"] <= t_fault
               and host in (None, str(a.get("runner")).rsplit(":", 1)[0]) for a in assigns)


class NodeLossTrials:
    """Trials on cluster ``c`` (nodes ``n1``.., login nodes ``l1``, ``l2``) in folder ``root`` (shared)."""

    def __init__(self, c: "Cluster", root: Path, *, members: int, cycles: int, seed: int, grace_s: float,
                 run_timeout_s: float, say: Callable[[str], None] = print):
        self.c, self.root, self.say = c, root, say
        self.members, self.cycles = members, cycles
        self.rng = random.Random(seed)
        self.grace_s, self.run_timeout_s = grace_s, run_timeout_s
        self.study = root / "study"
        self.tomls: dict[Mode, str] = {}
        self.refs: dict[Mode, Reference] = {}
        self._fault_free_s: list[float] = []

    # -- the study --------------------------------------------------------------------------------------------------

    def reference(self, mode: Mode) -> Reference:
        """Prepare the pristine study of ``mode`` and run it twice without a fault (cached): the two must be
        bitwise equal; the faster one's wall time is the span the trials' moments are drawn from."""
        if mode not in self.refs:
            self._fault_free_s.clear()
            demo = prepare(self.root / f"pristine-{mode}", mode, members=self.members, cycles=self.cycles)
            py = sys.executable
            self.tomls[mode] = (offline_toml(demo, py, slurm=True) if mode is Mode.OFFLINE
                                else online_toml(demo, py, slurm=True))
            runs = [self._fault_free(mode) for _ in range(2)]
            if runs[0] != runs[1]:
                raise RuntimeError(f"two fault-free {mode} runs differ: the study is not deterministic")
            seconds = min(self._fault_free_s)
            evs = events(self.study)
            analysis_s = {int(e["cycle"]): float(e["run_s"]) for e in evs
                          if e.get("event") == "task_end" and e.get("member") is None and "run_s" in e}
            self.refs[mode] = Reference(runs[0], seconds, _forecasts(evs, mode), analysis_s)
        return self.refs[mode]

    def _fault_free(self, mode: Mode) -> dict[str, bytes]:
        """One fault-free run of the study of ``mode``; its outputs (its seconds appended to ``_fault_free_s``)."""
        fresh_copy(self.root / f"pristine-{mode}", self.study, self.tomls[mode])
        t0 = time.monotonic()
        rc = self._wait(self._run(LAUNCHER_NODE))
        if rc != 0:
            raise RuntimeError(f"the fault-free {mode} run failed ({rc}): {self._tail()}")
        self._fault_free_s.append(time.monotonic() - t0)
        self._cleanup(set())
        return outputs(self.study)

    def _run(self, node: str) -> subprocess.Popen:
        with open(self.study / "launcher.log", "ab") as log:
            return self.c.popen(node, [sys.executable, "-m", "enkflow", "run", TOML], cwd=self.study, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)

    def _wait(self, p: subprocess.Popen) -> int | None:
        """The run's exit status; None when it ran past the time limit (then killed)."""
        try:
            return p.wait(timeout=self.run_timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            return None

    # -- one trial --------------------------------------------------------------------------------------------------

    def trial(self, scenario: Scenario, n: int) -> TrialResult:
        mode = scenario.mode
        ref = self.reference(mode)
        r = TrialResult(scenario=str(scenario), n=n, at_s=self.rng.uniform(0.0, ref.seconds))
        fresh_copy(self.root / f"pristine-{mode}", self.study, self.tomls[mode])
        killed: set[str] = set()
        t0 = time.monotonic()
        p = self._run(LAUNCHER_NODE)
        try:
            fault = Fault(self, p, t0 + r.at_s, killed)
            fault.inject(scenario)
            r.fault, r.injected, r.in_flight = fault.what, fault.injected, fault.in_flight
            r.on_target = scenario not in TARGET_PHASE or fault.phase is TARGET_PHASE[scenario]
            r.rc.append(self._wait(p))
            if scenario.loses_launcher and r.injected:
                again = SPARE_LOGIN if LAUNCHER_NODE in killed else LAUNCHER_NODE
                r.rc.append(self._wait(self._run(again)))
            r.seconds = time.monotonic() - t0
            r.completed = r.rc[-1] == 0
            r.equal = r.completed and outputs(self.study) == ref.outputs
            r.recomputed = _forecasts(events(self.study), mode) - ref.forecasts
            self._leftovers(r)
            if not r.completed:
                r.detail = self._tail()
        except Exception as exc:  # a broken trial is reported as such, never hidden
            r.detail = f"{type(exc).__name__}: {exc}"
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
        finally:
            self._cleanup(killed)
        return r

    def _tail(self) -> str:
        log = self.study / "launcher.log"
        return log.read_text(errors="replace")[-600:] if log.exists() else ""

    def _leftovers(self, r: TrialResult) -> None:
        """What the study left: processes on the live nodes (waiting up to ``grace_s`` for them to go), then
        the live nodes' ``/dev/shm`` names, and write-ahead logs, shadows, spares or commit markers beside the members."""
        t0 = time.monotonic()
        while (procs := study_processes(self.c, self.study)) and time.monotonic() - t0 < self.grace_s:
            time.sleep(0.5)
        r.left_processes, r.gone_after_s = procs, time.monotonic() - t0
        r.left_shm = shm_segments(self.c)
        members = self.study / "members"
        r.left_wal = sorted(str(p.relative_to(members)) for p in [*members.glob(".enkflow-update-*"),
                                                                   *members.glob(".enkflow-wal/*"),
                                                                   *members.glob(".member_*.enkflow-new-*"),
                                                                   *members.glob(".member_*.enkflow-old-*")])

    def _cleanup(self, killed: set[str]) -> None:
        """Kill what the study left, cancel every job, clear every /dev/shm, revive the lost nodes."""
        for pid in study_pids(self.c, self.study):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.c.run("head", ["scancel", "--full", "--user=root"], capture_output=True, timeout=60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            q = self.c.run("head", ["squeue", "-h"], capture_output=True, text=True, timeout=60)
            if not q.stdout.strip():
                break
            time.sleep(0.5)
        for node, names in shm_segments(self.c).items():
            for name in names:
                self.c.node_path(node, "/dev/shm").joinpath(name).unlink(missing_ok=True)
        for node in sorted(killed):
            self._revive(node)
        killed.clear()

    def _revive(self, node: str, attempts: int = 3) -> None:
        """Revive a lost node; a failed set-up (seen once under load: ``ip addr add`` failing without a
        message) is removed and made again."""
        for attempt in range(1, attempts + 1):
            try:
                self.c.revive_node(node)
                return
            except ClusterUnavailable as exc:
                self.say(f"reviving {node} failed (attempt {attempt}): {exc}")
                delete_netns(self.c.specs[node].netns)
                if attempt == attempts:
                    raise
                time.sleep(1.0)


class Fault:
    """Waits for the moment ``at`` (monotonic) of a trial, then injects its scenario's fault."""

    def __init__(self, trials: NodeLossTrials, run: subprocess.Popen, at: float, killed: set[str]):
        self.t, self.run, self.at, self.killed = trials, run, at, killed
        self.what, self.injected, self.in_flight = "", False, 0
        self.mode = Mode.OFFLINE
        self.phase: Phase | None = None  # analysis scenarios: where the update stood at the kill

    def _until(self, ready: Callable[[], object], deadline: float | None = None) -> object:
        """Poll ``ready`` until it gives something true; None when the run ended (or ``deadline`` passed)."""
        while self.run.poll() is None and (deadline is None or time.monotonic() < deadline):
            got = ready()
            if got:
                return got
            time.sleep(0.02)
        return None

    def _sleep_until_moment(self) -> bool:
        return self._until(lambda: time.monotonic() >= self.at) is not None

    def _kill_node(self, node: str, why: str, *, only_its_forecasts: bool = False) -> None:
        """Lose ``node``; in flight: every unfinished forecast, or only those running on it (a node of
        runners or pilots: the others go on)."""
        self.t.c.kill_node(node)
        self.killed.add(node)
        self.what, self.injected = f"{why}: {node}", True
        self._count_in_flight(node if only_its_forecasts else None)

    def _count_in_flight(self, host: str | None) -> None:
        """The forecasts in flight at the fault just made, from the events a moment later (an event of the
        last instants before the fault may still be on its way to the file)."""
        t_fault = time.time()
        time.sleep(0.3)
        self.in_flight = in_flight(events(self.t.study), self.mode, t_fault, host)

    def inject(self, scenario: Scenario) -> None:
        self.mode = scenario.mode
        if scenario is Scenario.OFFLINE_ANALYSIS_BEFORE or scenario is Scenario.OFFLINE_ANALYSIS_AFTER:
            return self._analysis(after=scenario is Scenario.OFFLINE_ANALYSIS_AFTER)
        if not self._sleep_until_moment():
            self.what = "the run ended before the moment"
            return None
        if scenario.loses_launcher and scenario is not Scenario.ONLINE_LAUNCHER_NODE:
            os.kill(self.run.pid, signal.SIGKILL)
            self.what, self.injected = "kill -9 enkflow run", True
            self._count_in_flight(None)
            return None
        if scenario is Scenario.ONLINE_LAUNCHER_NODE:
            return self._kill_node(LAUNCHER_NODE, "launcher's node")
        pick = {Scenario.OFFLINE_PILOT_NODE: self._pilot_nodes, Scenario.ONLINE_SERVER_NODE: self._server_nodes,
                Scenario.ONLINE_RUNNER_NODE: self._runner_nodes}[scenario]
        nodes = self._until(pick)
        if not nodes:
            self.what = "the run ended before a victim ran"
            return None
        return self._kill_node(self.t.rng.choice(sorted(nodes)), scenario.value.split("-", 1)[1],
                               only_its_forecasts=scenario is not Scenario.ONLINE_SERVER_NODE)

    def _pilot_nodes(self) -> set[str]:
        """Nodes of the pilots running now (a pilot's batch step: where its members run)."""
        up: dict[str, str] = {}
        for e in events(self.t.study):
            if e.get("event") == "job_start":
                up[str(e["worker"])] = str(e["worker"]).rsplit("-", 1)[0]
            elif e.get("event") == "job_end":
                up.pop(str(e.get("worker")), None)
        return set(up.values()) & set(self.t.c.nodes)

    def _server_nodes(self) -> set[str]:
        """Nodes of the server's ranks (its latest start)."""
        starts = [e for e in events(self.t.study) if e.get("event") == "online_start"]
        return set(starts[-1].get("nodes", [])) & set(self.t.c.nodes) if starts else set()

    def _runner_nodes(self) -> set[str]:
        """Nodes of the runners that joined and have not left."""
        up: dict[str, str] = {}
        for e in events(self.t.study):
            if e.get("event") == "runner_join":
                up[str(e["runner"])] = str(e["runner"]).rsplit(":", 1)[0]
            elif e.get("event") in ("runner_leave", "runner_lost", "runner_exit"):
                up.pop(str(e.get("runner")), None)
        return (set(up.values()) - self._server_nodes()) & set(self.t.c.nodes)

    def _analysis(self, *, after: bool) -> None:
        """Lose a node of a random cycle's analysis: before its write-ahead-log commit (rank 0's node, at a
        random moment in the first 80 % of the fault-free analysis's time, its phase checked at the kill) or
        right after it (the node of a random rank, while rank 0 is held at its first member write)."""
        cycle = self.t.rng.randint(1, self.t.cycles)
        delay = self.t.rng.random() * 0.8 * self.t.refs[Mode.OFFLINE].analysis_s.get(cycle, 1.0)
        barrier = AnalysisBarrier(self.t.c, self.t.study, self.t.members, cycle)
        try:
            ranks = self._until(barrier.attach if after else barrier.ranks_nodes)
            if not isinstance(ranks, dict) or 0 not in ranks:
                self.what = f"cycle {cycle}: the run ended before its analysis ran"
                return None
            if after:
                if not self._until(barrier.stopped, time.monotonic() + self.t.run_timeout_s):
                    self.what = f"cycle {cycle}: the analysis was not held after its commit {barrier.note}"
                    return None
                victim = self.t.rng.choice(sorted(ranks))
            else:
                self._until(lambda: False, time.monotonic() + delay)
                victim = 0
            where = phase(self.t.study, barrier.files, cycle)
            self._kill_node(ranks[victim], f"cycle {cycle} analysis rank {victim}'s node, {where}")
            self.phase = where
        finally:
            barrier.release()
