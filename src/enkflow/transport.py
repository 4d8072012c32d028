"""How runners exchange member states with the assimilation server on its node (:class:`Transport`).

The choice is made in ``[online] transport`` (the experiment's configuration), passed to the runners that
enkflow starts as ``ENKFLOW_TRANSPORT`` and read by the Python runner and the C library alike; the
shared-memory segments themselves are :mod:`enkflow.online.segments`.
"""

from __future__ import annotations

import os
from enum import StrEnum

from enkflow.errors import ConfigError

TRANSPORT_ENV = "ENKFLOW_TRANSPORT"


class Transport(StrEnum):
    """How runners on the server's node exchange states: shared memory where they can (AUTO), always
    (SHM: an error where they cannot), or never (TCP)."""

    AUTO = "auto"
    SHM = "shm"
    TCP = "tcp"

    @classmethod
    def from_environment(cls) -> "Transport":
        """``ENKFLOW_TRANSPORT`` (AUTO when unset); another value is a ConfigError naming the variable."""
        value = os.environ.get(TRANSPORT_ENV, "").strip().lower()
        if not value:
            return cls.AUTO
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(f"{TRANSPORT_ENV}={value!r} is not one of {', '.join(t.value for t in cls)}",
                              key=TRANSPORT_ENV) from None
