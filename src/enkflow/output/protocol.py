"""Messages between an :class:`~enkflow.output.Output` and its writers (ZeroMQ DEALER -> ROUTER).

Every message is multipart: one UTF-8 JSON frame (metadata only, never pickle), then, for a PUT
over ipc/tcp, one raw frame with the array's bytes (sent without a copy): the framing of
:mod:`enkflow.online.wire`, without its fixed header (the output layer sits below the
experiment and online layers, so it does not import them). Over shared memory the PUT names
its slot of the sender's ring instead. Sender -> writer:

    hello   {ring: path | null, client}            reply welcome
    put     {seq, field, time, member, region, dtype, shape, slot: [offset, nbytes] | null}
                                                   reply ack {seq, warning?} or error {seq, error, fatal}
    sync    {seq}                                  reply synced {seq, stats}: all earlier puts are written
    bye     {seq}                                  reply bye {seq, stats}: this sender is done
    finish  {seq, finish_windows}                  reply finished {seq, stats, incomplete}; the writer exits
    discard {seq, time}                            reply discarded {seq, dropped}: after the earlier puts, the
                                                   writer forgets that time of its fields (open: abandoned,
                                                   written: may be written again, replacing the file)

The writer handles each sender's messages in order, so acknowledgements free ring slots in
the order they were allocated. The writer's progress is not a message: its heartbeat page
(:mod:`enkflow.output.heartbeat`, path in the writer's start-up spec) lets a waiting sender tell a
slow writer from a hung one without the writer having to answer.
"""

from __future__ import annotations

import json
from typing import Any

from enkflow.errors import EnkflowError

HELLO, WELCOME, PUT, ACK, ERROR, SYNC, SYNCED, BYE, FINISH, FINISHED = (
    "hello", "welcome", "put", "ack", "error", "sync", "synced", "bye", "finish", "finished")
DISCARD, DISCARDED = "discard", "discarded"
MAX_JSON_BYTES = 1 << 20


class ProtocolError(EnkflowError):
    """A message that does not follow the output protocol."""


def encode(kind: str, **meta: Any) -> bytes:
    return json.dumps({"kind": kind, **meta}, separators=(",", ":")).encode()


def put_fixed(**fields: Any) -> str:
    """The JSON members that :func:`put_notice` repeats in every notice of one field (no braces)."""
    return json.dumps(fields, separators=(",", ":"))[1:-1]


def put_notice(slot: int, nbytes: int, time: float, member: int | None, region: list[list[int]] | None,
               fixed: str) -> bytes:
    """What ``encode(PUT, slot=[slot, nbytes], time=time, member=member, region=region, **fields)`` gives
    (members in another order), ``fixed`` being ``put_fixed(**fields)``: a shared-memory ring's notice.
    Only the numbers are formatted per piece: json.dumps of the whole took about a tenth of an add's
    time. ``time`` is finite (``add`` checked it), so its repr is JSON."""
    r = "null" if region is None else json.dumps(region, separators=(",", ":"))
    m = "null" if member is None else str(int(member))
    head = f'{{"kind":"put","slot":[{int(slot)},{int(nbytes)}],"time":{float(time)!r},'
    return f'{head}"member":{m},"region":{r},{fixed}}}'.encode()


def decode(frame: bytes | memoryview) -> dict[str, Any]:
    b = bytes(frame)
    if len(b) > MAX_JSON_BYTES:
        raise ProtocolError(f"an output message of {len(b)} bytes, more than {MAX_JSON_BYTES}")
    try:
        msg = json.loads(b.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"an output message is not valid JSON: {exc}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("kind"), str):
        raise ProtocolError("an output message without a 'kind'")
    return msg
