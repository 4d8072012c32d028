"""The warnings of a report: what went wrong in a run that a user must look at (read from its event log)."""

from __future__ import annotations

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
            out.append(f"runner job {e.get('job')} exited before the study ended; another was started")
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

