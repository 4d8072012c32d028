"""Online mode: an assimilation server and model runners that exchange member states in memory.

pyzmq is imported in this package only. :class:`Runner` is the model side
(:mod:`enkflow.online.runner`), :class:`Server` the assimilation side
(:mod:`enkflow.online.server`); :mod:`enkflow.online.wire` is the protocol.
"""

from enkflow.online.connection import ServerError, ServerLost
from enkflow.online.fields import Field
from enkflow.online.runner import Extent, Runner
from enkflow.online.scheduler import SchedulerConfig
from enkflow.transport import Transport
from enkflow.online.server import Problem, Server, ServerConfig
from enkflow.online.wire import PROTOCOL_VERSION, ProtocolError

__all__ = ["Extent", "Field", "PROTOCOL_VERSION", "Problem", "ProtocolError", "Runner", "SchedulerConfig", "Server",
           "ServerConfig", "ServerError", "ServerLost", "Transport"]
