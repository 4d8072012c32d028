"""Whether a runner process that ``enkflow run`` started ever greeted the server, and as which runner.

The supervisor cannot see a HELLO that the server has not read yet (a server that died, hung or was cut
off), so the runner says so itself: :class:`~enkflow.online.runner.Runner` appends its id (the ``runner``
of its messages, and the ``id`` of the server's ``runner_join`` and ``online_reject`` events) to the file
named by ``ENKFLOW_RUNNER_CONTACT`` before its first HELLO. A runner that exits without having written
it failed before it reached the server (its script missing, an import error); one that did is matched
with the server's events by its id (:mod:`enkflow.online.process_ends`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CONTACT_ENV = "ENKFLOW_RUNNER_CONTACT"


def note_contact(runner_id: int) -> None:
    """Record, where ``enkflow run`` asks for it, that runner ``runner_id`` greets the server now."""
    path = os.environ.get(CONTACT_ENV)
    if not path:
        return
    try:
        with open(path, "a", encoding="ascii") as fh:
            fh.write(f"{runner_id}\n")
    except OSError as exc:  # only the supervisor's judgement of a failed start depends on it, not the study
        print(f"enkflow runner: cannot write {path} ({CONTACT_ENV}): {exc}", file=sys.stderr, flush=True)


def contacts(path: Path) -> set[int]:
    """The ids of the runners of the process that ``path`` was given to, that greeted the server."""
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return set()
    return {int(line) for line in text.split() if line.isdigit()}
