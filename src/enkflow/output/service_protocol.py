"""The messages between the study-wide output service (:mod:`enkflow.output.service`) and its
clients: :class:`~enkflow.output.remote.RemoteOutput`, and the native client (native/src/output.c,
which speaks them too: a change here is a change there).

Messages (multipart: one UTF-8 JSON frame, never pickle, then for ``add`` one raw frame with the
array's bytes, C order); client -> service, each reply to the same client:

    hello    {credential, pid, host}           reply welcome {config, pid, host}, or error {error}
    add      {seq, field, time, member, region, dtype, shape} + data     no reply
    sync     {seq}                             reply synced {seq, error, stats}: every piece added so
                                               far (by any client) is written
    discard  {seq, time}                       reply discarded {seq, dropped, error}
    bye      {seq}                             reply bye {seq, error, stats}: every add of this client
                                               was received and handed to the writers (not yet written)
    stop     {credential}   (the owner only)   reply stopped {error, stats, notes}; the service exits

``credential`` is the hex SHA-256 of ``"enkflow-output-token" NUL token`` (:func:`enkflow.tokens.credential`).
``dtype`` is ``"<f4"`` or ``"<f8"``; ``region`` ``[[start, stop], ...]`` per dimension or null (the
whole field). The welcome also names the service's progress page (``heartbeat``) and the setting its
writer timeout came from (``timeout_key``). Back-pressure: ZeroMQ's high-water marks (``HWM``
messages each side) bound what waits between a client and the service, and the client's send then
blocks.
"""

from __future__ import annotations

from enkflow.tokens import credential

DOMAIN = b"enkflow-output-token"
HWM = 8  # messages queued per client on each side before its send blocks
ADD, STOP, STOPPED = "add", "stop", "stopped"
TIMEOUT_KEY = "output.writer_timeout"  # the setting a service's writer timeout comes from, unless told otherwise
DTYPES = ("<f4", "<f8", ">f4", ">f8")  # the client's byte order, converted by the service


def token_credential(token: str) -> str:
    return credential(token, DOMAIN).hex()
