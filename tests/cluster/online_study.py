"""The online demo study of the multi-node tests: its experiment file, the one-node run, its logs (what is
compared and the events: ``enkflow_testing.node_loss_study``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

MEMBERS, CYCLES = 8, 2


def online_toml(text: str, launcher: str, sleep: float = 0.0, **settings: object) -> str:
    """The demo's ``experiment.toml`` with its last sections, [launcher] and [online], replaced: a 2-rank
    server and 2 demo runners idling ``sleep`` s per forecast, then ``settings``."""
    runner = (f"{sys.executable} -m enkflow.online.models demo --address {{address}} --token-file {{token_file}} "
              f"--grid {{restart}} --length {{length}} --sleep {sleep:g}")
    online = {"runner": runner, "runners": 2, "ranks": 2, **settings}
    body = "".join(f"{k} = {json.dumps(v)}\n" for k, v in online.items())
    return text[:text.index("\n[launcher]")] + f'\n[launcher]\nkind = "{launcher}"\n\n[online]\n{body}'


def run_here(study: Path) -> None:
    """``enkflow run`` of ``study`` on this machine (one node)."""
    r = subprocess.run([sys.executable, "-m", "enkflow", "run", str(study / "experiment.toml")], cwd=study,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def logs(study: Path) -> str:
    return "".join(f"\n== {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                   for p in sorted((study / "run" / "online" / "logs").glob("*.log")))
