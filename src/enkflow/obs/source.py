"""Where a cycle's observations come from: the file, the state it observes and the settings it is read with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from enkflow.obs.settings import ObsSettings
from enkflow.state import StateLayout


@dataclass(frozen=True)
class ObsFileSource:
    """A cycle's observation file ``path`` for the state ``layout`` with the ``[observations]``
    ``settings``; ``hx_files`` (member 1 first): H(x) of the forecasts from an operator stage."""

    path: Path
    layout: StateLayout
    settings: ObsSettings
    cycle: int | None = None
    hx_files: tuple[Path, ...] | None = None
