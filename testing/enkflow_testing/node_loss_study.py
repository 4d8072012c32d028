"""The study of the node-loss trials and of the multi-node acceptance tests: the demo problem, offline or
online, on the emulated cluster (:mod:`enkflow_testing.cluster`) through its SLURM, and what a trial
measures of it afterwards (its outputs, its events, what it left on the nodes).

Offline, the study runs dynamic pilot jobs of 2 nodes each (``[launcher] nodes = 2``, one task per node),
and the built-in analysis runs as 2 MPI ranks on both nodes with the mpich wheel's ``mpiexec -n 2``, whose
hydra proxies start under ``srun`` in the pilot's allocation. (``srun --mpi=pmi2`` directly hung in 1 of
3 runs: Slurm 22.05's pmi2 plugin rejects some of MPICH's long PMI-2 ``put`` requests, "value not
properly terminated", and the ranks wait for ever; plain ``srun`` would start 2 serial analyses.) Online, the 2-rank server is one SLURM job on 2 nodes (``[online] nodes = 2``) listening on
each node's interface (``bind = "*"``), and the runners are SLURM jobs of their own.

A study always runs in the same folder (the analysis mean files name their template's path), copied
afresh from a pristine one before each run.
"""

from __future__ import annotations

import json
import shutil
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from enkflow_testing.online_faults import nc_content

if TYPE_CHECKING:
    from enkflow_testing.cluster import Cluster

TOML = "experiment.toml"
# [launcher] settings of the studies on SLURM: what a lost launcher leaves stops within about 20 s.
SLURM_SETTINGS = {"lease_timeout": 5.0}


class Mode(StrEnum):
    OFFLINE = "offline"
    ONLINE = "online"


def prepare(pristine: Path, mode: Mode, *, members: int, cycles: int) -> str:
    """Write the demo problem (tiny synthetic land, LETKF) into ``pristine``; returns its ``experiment.toml`` text."""
    from enkflow.experiment.demo_problem import DemoSettings, prepare as demo_prepare

    return demo_prepare(pristine, DemoSettings(members=members, cycles=cycles, mode=str(mode)), lambda _m: None).read_text()


def _tables(**tables: dict[str, object]) -> str:
    """TOML tables of plain values (JSON's strings, numbers and booleans are valid TOML)."""
    return "".join(f"\n[{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in body.items())
                   for name, body in tables.items())


def offline_toml(demo: str, python: str, *, slurm: bool, model_sleep: float = 0.0) -> str:
    """The demo's offline ``experiment.toml`` with 2 pilots: local processes, or SLURM jobs of 2 nodes whose
    analysis runs as 2 ranks on both (``python``'s ``mpiexec``). ``model_sleep``: seconds each forecast idles."""
    head = demo[:demo.index("\n[jobs]")]
    if model_sleep:
        head = head.replace("--cycle {cycle}", f"--cycle {{cycle}} --sleep {model_sleep:g}")
    jobs: dict[str, object] = {"strategy": "dynamic", "poll": 0.1, "workers": 2, "heartbeat": 0.5, "lease": 5.0}
    if not slurm:
        return head + _tables(jobs=jobs, launcher={"kind": "local"})
    return head + _tables(analysis_task={"launcher": f"{Path(python).parent / 'mpiexec'} -n 2"}, jobs={**jobs, "cpus_per_job": 2},
                          launcher={"kind": "slurm", "nodes": 2, **SLURM_SETTINGS})


def online_toml(demo: str, python: str, *, slurm: bool) -> str:
    """The demo's online ``experiment.toml`` with a 2-rank server and 2 runners: on this machine (loopback), or
    SLURM jobs with the server on 2 nodes listening on their interfaces."""
    head = demo[:demo.index("\n[launcher]")]
    runner = (f"{python} -m enkflow.online.models demo --address {{address}} --token-file {{token_file}} "
              "--grid {restart} --length {length}")
    online: dict[str, object] = {"runner": runner, "runners": 2, "ranks": 2, "heartbeat": 0.5, "heartbeat_timeout": 3.0}
    if not slurm:
        return head + _tables(launcher={"kind": "local"}, online=online)
    return head + _tables(launcher={"kind": "slurm", **SLURM_SETTINGS}, online={**online, "nodes": 2, "bind": "*", "rank_timeout": 3.0})


def fresh_copy(pristine: Path, study: Path, toml: str) -> None:
    """``study`` becomes a copy of ``pristine`` with ``toml`` as its experiment file."""
    shutil.rmtree(study, ignore_errors=True)
    shutil.copytree(pristine, study)
    (study / TOML).write_text(toml)


def outputs(study: Path) -> dict[str, bytes]:
    """Every byte of the member restarts, and the content of each cycle's analysis mean and spread files."""
    out = {p.name: p.read_bytes() for p in sorted((study / "members").glob("member_*.nc"))}
    for p in sorted((study / "run" / "cycles").glob("*/analysis_*.nc")):
        out[str(p.relative_to(study))] = nc_content(p)
    return out


def events(study: Path) -> list[dict]:
    """The study's ``run/events.jsonl`` (a torn last line, from a process killed while writing it, skipped)."""
    path = study / "run" / "events.jsonl"
    rows = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def study_processes(c: "Cluster", study: Path) -> dict[str, list[str]]:
    """Per live node, the command lines of its processes that name the study's folder (empty nodes left out)."""
    found = {}
    for node in [*c.names, *c.login_names]:
        cmds = [f"{pid} {cmd[:160]}" for pid in c.processes(node) if str(study) in (cmd := _cmdline(pid))]
        if cmds:
            found[node] = cmds
    return found


def study_pids(c: "Cluster", study: Path) -> list[int]:
    """The pids of :func:`study_processes`."""
    return [int(line.split()[0]) for cmds in study_processes(c, study).values() for line in cmds]


def shm_segments(c: "Cluster") -> dict[str, list[str]]:
    """Per live node, the names in its private ``/dev/shm`` (the nodes' own; empty nodes left out)."""
    found = {}
    for node in [*c.names, *c.login_names]:
        if node in c.nodes:
            names = sorted(p.name for p in c.node_path(node, "/dev/shm").iterdir())
            if names:
                found[node] = names
    return found
