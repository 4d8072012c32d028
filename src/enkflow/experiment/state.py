"""The resume state of an experiment directory (``state.json``).

The driver records a cycle as finished only after its analysis is confirmed
done; everything inside a cycle is recovered from the cycle's to-do list and
done-markers. Rerunning ``enkflow run`` therefore continues where a crash or
kill stopped it, without rerunning finished members or cycles.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from enkflow.errors import ConfigError
from enkflow.jobs.files import read_json, write_json_atomic


@dataclass
class ExperimentState:
    """``digest``: the configuration's result-relevant hash; ``cycles_done``: finished cycles."""

    path: Path
    digest: str
    cycles_done: list[int] = field(default_factory=list)
    created: float = field(default_factory=time.time)

    @classmethod
    def open(cls, expdir: Path, digest: str) -> tuple["ExperimentState", bool]:
        """The state of ``expdir`` (created if absent); True when an earlier run is resumed.

        A directory holding a run with a different configuration is refused.
        """
        path = expdir / "state.json"
        data = read_json(path)
        if data is None:
            st = cls(path, digest)
            st.save()
            return st, False
        if data.get("digest") != digest:
            raise ConfigError(f"{expdir} holds an experiment run with a different configuration; "
                              "choose another experiment.directory or remove that one", key="experiment.directory")
        return cls(path, digest, list(data.get("cycles_done", [])), float(data.get("created", time.time()))), True

    def save(self) -> None:
        write_json_atomic(self.path, {"digest": self.digest, "cycles_done": self.cycles_done, "created": self.created})

    def mark_done(self, cycle: int) -> None:
        if cycle not in self.cycles_done:
            self.cycles_done.append(cycle)
            self.save()
