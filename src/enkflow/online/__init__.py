"""Online mode: an assimilation server and model runners that exchange member states in memory.

pyzmq is imported in this package only. :class:`Runner` is the model side
(:mod:`enkflow.online.runner`), :class:`Server` the assimilation side
(:mod:`enkflow.online.server`); :mod:`enkflow.online.wire` is the protocol.
"""

from __future__ import annotations

import importlib
from typing import Any

# Where each public name lives. Imported on first use (PEP 562), so a model's runner process that needs only
# ``Runner`` does not import the server, the analysis and SciPy (0.7 s of its start-up, once per runner).
_EXPORTS = {
    "Extent": "enkflow.online.runner", "Field": "enkflow.online.fields", "PROTOCOL_VERSION": "enkflow.online.wire",
    "Problem": "enkflow.online.server", "ProtocolError": "enkflow.online.wire", "Runner": "enkflow.online.runner",
    "SchedulerConfig": "enkflow.online.scheduler", "Server": "enkflow.online.server",
    "ServerConfig": "enkflow.online.server", "ServerError": "enkflow.online.connection",
    "ServerLost": "enkflow.online.connection", "Transport": "enkflow.transport",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'enkflow.online' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
