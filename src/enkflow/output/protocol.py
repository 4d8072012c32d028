"""Messages between an :class:`~enkflow.output.Output` and its writers (ZeroMQ DEALER -> ROUTER).

Every message is multipart: one UTF-8 JSON frame (metadata only, never pickle; coded by
:mod:`enkflow.online.wire`), then, for a PUT over ipc/tcp, one raw frame with the array's
bytes (sent without a copy). Over shared memory the PUT names its slot of the sender's ring
instead. Sender -> writer:

    hello   {ring: path | null, client}            reply welcome
    put     {seq, field, time, member, region, dtype, shape, slot: [offset, nbytes] | null}
                                                   reply ack {seq} or error {seq, error}
    sync    {seq}                                  reply synced {seq, stats}: all earlier puts are written
    bye     {seq}                                  reply bye {seq, stats}: this sender is done
    finish  {seq, finish_windows}                  reply finished {seq, stats, incomplete}; the writer exits

The writer handles each sender's messages in order, so acknowledgements free ring slots in
the order they were allocated.
"""

from __future__ import annotations

from typing import Any

from enkflow.online.wire import decode_json, encode_json

HELLO, WELCOME, PUT, ACK, ERROR, SYNC, SYNCED, BYE, FINISH, FINISHED = (
    "hello", "welcome", "put", "ack", "error", "sync", "synced", "bye", "finish", "finished")


def encode(kind: str, **meta: Any) -> bytes:
    return encode_json({"kind": kind, **meta})


def decode(frame: bytes | memoryview) -> dict[str, Any]:
    msg = decode_json(frame, "output")
    if not isinstance(msg.get("kind"), str):
        from enkflow.online.wire import ProtocolError

        raise ProtocolError("an output message without a 'kind'")
    return msg
