"""The resume state of an experiment directory (``state.json``).

The driver records a cycle as finished only after its analysis is confirmed
done; everything inside a cycle is recovered from the cycle's to-do list and
done-markers. Rerunning ``enkflow run`` therefore continues where a crash or
kill stopped it, without rerunning finished members or cycles.

Configuration changes on resume. Each finished cycle records the digests of
the settings its steps depended on (:meth:`ExperimentConfig.digests`):
``ensemble`` (members, restarts, state) may never change; ``model`` and
``analysis`` may not change for finished cycles, nor for the steps of the
started cycle that already ran (its done members, its applied analysis);
anything no finished step depended on may change, e.g. a fixed analysis
setting after the analysis failed. The first state of the restarts is kept as
``initial`` fingerprints.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enkflow.errors import ConfigError
from enkflow.experiment.config import ExperimentConfig
from enkflow.experiment.settings_diff import describe, recorded_changes
from enkflow.fsutil import read_json, write_json_atomic

VERSION = 2

# The parts of ExperimentConfig.digests and the settings of each, for messages.
_PARTS = (("ensemble", "[experiment] members/restart/initial/forecast_length/first_cycle, [state]"),
          ("model", "[model]"), ("analysis", "[analysis], [analysis_task], [observations]"))


@dataclass
class ExperimentState:
    """``digests``: the settings the finished cycles ran with; ``cycles_done``: finished cycles;
    ``initial``: fingerprints of the restarts the experiment started from."""

    path: Path
    digests: dict[str, str]
    cycles_done: list[int] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    initial: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> "ExperimentState | None":
        """The state recorded in ``path`` (:attr:`ExperimentDir.state
        <enkflow.experiment.directory.ExperimentDir.state>`), or None for a new experiment."""
        data = read_json(path)
        if data is None:
            return None
        if data.get("version") != VERSION:
            raise ConfigError(f"{path} was written by another enkflow version (state version "
                              f"{data.get('version', 1)}, this one reads {VERSION}); finish it with that version, "
                              "or start a new experiment directory", key="experiment.directory")
        return cls(path, dict(data["digests"]), list(data.get("cycles_done", [])), float(data.get("created", time.time())),
                   dict(data.get("initial", {})))

    @classmethod
    def create(cls, path: Path, digests: dict[str, str], initial: dict[str, Any]) -> "ExperimentState":
        st = cls(path, dict(digests), initial=initial)
        st.save()
        return st

    def check_finished(self, cfg: ExperimentConfig) -> None:
        """Refuse settings of ``cfg`` that differ from those the finished cycles (or the ensemble) depend
        on; the error names each changed key with its recorded and new value where the experiment's
        ``config.json`` holds the recorded settings (:mod:`enkflow.experiment.settings_diff`)."""
        digests = cfg.digests()
        for part, sections in _PARTS:
            if part != "ensemble" and not self.cycles_done or digests[part] == self.digests[part]:
                continue
            done = (f"cycles {self.cycles_done[0]}-{self.cycles_done[-1]} ran" if self.cycles_done
                    else "the experiment was set up")
            changes = recorded_changes(cfg, part, self.digests[part], cfg.dir.config)
            raise ConfigError(
                f"{self.path.parent} holds an experiment whose {sections} settings differ from this configuration"
                f"{describe(changes)}; {done} with the recorded ones: restore those settings to resume, or start a "
                "new experiment from restarts you choose (see experiment.initial and --accept-restarts)",
                key=changes[0].key if changes else part)

    def save(self) -> None:
        write_json_atomic(self.path, {"version": VERSION, "digests": self.digests, "cycles_done": self.cycles_done,
                                      "created": self.created, "initial": self.initial})

    def mark_done(self, cycle: int, digests: dict[str, str]) -> None:
        if cycle not in self.cycles_done:
            self.cycles_done.append(cycle)
        self.digests = dict(digests)
        self.save()
