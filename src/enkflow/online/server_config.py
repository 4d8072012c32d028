"""How the assimilation server listens, schedules and checks (:class:`ServerConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from enkflow.online.scheduler import SchedulerConfig
from enkflow.transport import Transport


@dataclass(frozen=True)
class ServerConfig:
    """Where and how the server listens; times in seconds.

    ``bind`` is the interface: loopback unless set; an address, an interface name
    (``eth0``) or ``*`` / ``0.0.0.0`` (every interface, advertised with an address of
    the node's interface: :func:`enkflow.netaddr.advertised`); ``port`` the control port
    (0: any free port; the address is written to ``address_file`` once the ensemble is loaded
    and HELLOs are answered). ``rank_timeout_s``: a server rank silent this long on the ranks' bus (a lost node) stops the server.
    ``curve_secret_key`` (Z85) turns on ZeroMQ CURVE encryption; runners then
    need the matching public key. ``stateless_check``: in the first cycle of a new
    study member 1 runs twice and the two forecasts must agree bit for bit (a
    model keeping state between exposes would give members the wrong history).
    ``min_runners``: hand out no member before this many runners have joined (for
    benchmarks and tests that need every runner to take part). ``stop_file`` is written
    before runners are told to stop, once the last cycle is done or on a failure (so that a
    supervisor neither reports nor replaces a runner that stopped because it was told). ``transport``: AUTO puts
    every rank's share in shared memory for runners on its node where it can (else an
    ``online_shm_unavailable`` event, and TCP), SHM insists (a ConfigError where it cannot), TCP never.
    """

    token: str
    bind: str = "127.0.0.1"
    port: int = 0
    heartbeat_s: float = 1.0
    heartbeat_timeout_s: float = 10.0
    rank_timeout_s: float = 30.0
    scheduler: SchedulerConfig = SchedulerConfig()
    checkpoint_dir: Path | None = None
    curve_secret_key: str | None = None
    address_file: Path | None = None
    stateless_check: bool = False
    min_runners: int = 1
    stop_file: Path | None = None
    transport: Transport = Transport.AUTO
