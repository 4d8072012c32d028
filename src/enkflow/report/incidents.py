"""The warnings of a report, and the failure that stopped a run: what went wrong that a user must look at
(read from its event log)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def warnings(events: list[dict[str, Any]]) -> list[str]:
    """What a user must look at: members whose model exited 0 but left the restart unchanged,
    forecasts rerun from their protected restart."""
    out = []
    for e in events:
        if e["event"] == "task_unchanged":
            out.append(f"cycle {e.get('cycle')}, member {e.get('member')}: the model exited 0 but left its restart "
                       f"{e.get('restart')} unchanged (command: {' '.join(map(str, e.get('argv', [])))})")
        elif e["event"] == "task_restore":
            out.append(f"cycle {e.get('cycle')}, member {e.get('member')}: rerun from its protected restart "
                       "(an earlier attempt failed or was killed)")
        elif e["event"] == "archive_fail":
            out.append(_first_line(e.get("error")))
    return out


def _first_line(text: Any, limit: int = 300) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def online_warnings(events: list[dict[str, Any]]) -> list[str]:
    """An online experiment's: members rescheduled (runner lost, late, failed, left; forecast rejected),
    server restarts, runner processes replaced, failed statelessness checks, the reason the study
    stopped, and a summary of the messages the server refused."""
    out: list[str] = []
    rejects: dict[str, int] = {}
    for e in events:
        name = e["event"]
        if name == "task_requeue":
            err = e.get("error")
            out.append(f"cycle {e.get('cycle')}, member {e.get('member')}: rescheduled ({e.get('reason')})"
                       + (f": {_first_line(err)}" if err else ""))
        elif name == "server_crash":
            out.append(f"the server exited without finishing; started again from its checkpoints "
                       f"(restart {e.get('restart')})")
        elif name == "online_start" and e.get("resumed"):
            cycles = e.get("cycles") or []
            rec = e.get("recovered_forecasts") or []
            out.append(f"the server resumed from its checkpoints at cycle {cycles[0] if cycles else '?'}"
                       + (f"; {len(rec)} forecast(s) of that cycle recovered, not run again" if rec else ""))
        elif name == "runner_exit":
            status = e.get("status")
            how = f" with status {status}" if status is not None else ""
            out.append(f"runner job {e.get('job')} exited{how} before the study ended; another was started")
        elif name == "stateless_check" and not e.get("ok", True):
            out.append(f"cycle {e.get('cycle')}, member {e.get('member')}: the statelessness check failed: "
                       f"{_first_line(e.get('reason'))}")
        elif name == "experiment_fail":
            why = e.get("reason") or (e.get("report") or {}).get("reason")
            line = f"the study stopped: {_first_line(why)}"
            if line not in out:
                out.append(line)
        elif name == "archive_fail":
            out.append(_first_line(e.get("error")))
        elif name == "online_reject":
            reason = _first_line(e.get("reason"), 200)
            rejects[reason] = rejects.get(reason, 0) + 1
    if rejects:
        n = sum(rejects.values())
        top = sorted(rejects.items(), key=lambda kv: -kv[1])
        shown = "; ".join(r + (f" (x{c})" if c > 1 else "") for r, c in top[:5]) + ("; ..." if len(top) > 5 else "")
        out.append(f"the server refused {n} message(s): {shown}")
    return out


@dataclass(frozen=True)
class Failure:
    """Why a run stopped: the cycle, the task that failed (``member 3``, ``the analysis``), its error and the
    log that holds the cause (None where the event names none)."""

    cycle: int | None
    task: str
    error: str
    log: str | None

    def lines(self) -> list[str]:
        """The failure in words, for the top of the report."""
        where = f"cycle {self.cycle}, " if self.cycle is not None else ""
        out = [f"FAILED: {where}{self.task}: {self.error.splitlines()[0] if self.error else '?'}"]
        out += [f"  {line}" for line in self.error.splitlines()[1:]]
        if self.log:
            out.append(f"  the cause is in: {self.log}")
        return out


def _task_name(e: dict[str, Any], members: dict[int, Any]) -> str:
    member = e.get("member", members.get(e.get("task")) if isinstance(e.get("task"), int) else None)
    if member is not None:
        return f"member {member}"
    return "the analysis" if e.get("task") is not None else "the study"


def failure(events: list[dict[str, Any]]) -> Failure | None:
    """The last run's ``experiment_fail``, with what the failed task's own report says (offline: the step,
    its exit status, the tail of its stderr and its log; online: the reason). None where the last run (the
    events since the last ``experiment_start`` or ``resume``) did not fail: a failure that a rerun went past is history."""
    starts = [i for i, e in enumerate(events) if e["event"] in ("experiment_start", "resume")]
    last_run = events[starts[-1]:] if starts else events
    fails = [e for e in last_run if e["event"] == "experiment_fail"]
    if not fails:
        return None
    e = fails[-1]
    rep = e.get("report") or {}
    members = {t["task"]: t.get("member") for t in events if t["event"] == "task_fail" and t.get("cycle") == e.get("cycle")}
    reason = e.get("reason") or rep.get("reason")
    if reason is None and rep.get("returncode") is not None:
        reason = f"{rep.get('step', 'model')} exited with status {rep['returncode']}"
    tail = str(rep.get("stderr_tail") or "").strip()
    error = str(reason or "stopped") + ("\nstderr (last lines):\n" + tail if tail else "")
    return Failure(cycle=e.get("cycle"), task=_task_name(e, members), error=error, log=rep.get("log") or e.get("log"))
