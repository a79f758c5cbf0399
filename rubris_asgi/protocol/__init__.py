"""The rubris v1 wire codec: bytes in, dataclasses out, and back (sans-IO).

This package is the only place that knows the byte layout of the wire contract, protocol.md
(sections 1-4). It does no I/O, imports nothing async and never inflates or deflates: a
compressed payload is carried as it came, with ``compressed=True`` on its dataclass, and
compression.py does the rest.

Layout::

    frame   = message+                      one WebSocket message or long-poll body, never empty
    message = kind:u8  len:uv  body         body is exactly len bytes
    kind    = low 7 bits name the kind, bit 0x80 (COMPRESSED) marks a deflated payload

    uv   unsigned LEB128, low group first, at most 10 bytes, value < 2**64, minimal encoding only
    str  uv byte length, then UTF-8
    rest the remainder of the body (the payload field of PUSH, RESULT, STREAM, SUBSCRIBE, CALL,
         PUBLISH); only ``rest`` payloads may be compressed

Three modules, one concept each:

- ``messages``: the kinds, modes and codecs, and one frozen dataclass per kind whose fields are
  the wire fields in wire order, annotated with their wire types;
- ``wire``: the primitive types, written and read, with the error messages that name the kind,
  the field and the frame offset;
- ``codec``: each kind's encoder and parser, built from its dataclass; :func:`encode`,
  :func:`encode_frame`, :func:`iter_messages`, :func:`decode_frame`, and the fast paths that
  build a message without a dataclass: :func:`push_message` (fan-out) and :func:`item_message`
  (a queue delivery).

Beside them, ``naming`` words the errors both sides build from a caller's input: a topic or
method name quoted and bounded (``quoted``), a value the encoder refused (``value_refused``).
"""

from .codec import (
    decode_frame,
    encode,
    encode_frame,
    encode_message,
    entry_message,
    item_message,
    iter_messages,
    push_message,
)
from .messages import (
    COMPRESSED,
    COMPRESSIBLE,
    SUBPROTOCOL,
    VERSION,
    Ack,
    Call,
    ClientMessage,
    Codec,
    Entry,
    EntryOp,
    Flow,
    Gap,
    Goodbye,
    Hello,
    Item,
    Kind,
    Message,
    Mode,
    Nack,
    Nak,
    Ping,
    Pong,
    Publish,
    Push,
    Rejected,
    Result,
    Revoke,
    ServerMessage,
    Stream,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
    Welcome,
)
from .wire import encode_str, encode_uv

__all__ = [
    "COMPRESSED",
    "COMPRESSIBLE",
    "SUBPROTOCOL",
    "VERSION",
    "Ack",
    "Call",
    "ClientMessage",
    "Codec",
    "Entry",
    "EntryOp",
    "Flow",
    "Gap",
    "Goodbye",
    "Hello",
    "Item",
    "Kind",
    "Message",
    "Mode",
    "Nack",
    "Nak",
    "Ping",
    "Pong",
    "Publish",
    "Push",
    "Rejected",
    "Result",
    "Revoke",
    "ServerMessage",
    "Stream",
    "Subscribe",
    "Subscribed",
    "Unsubscribe",
    "Unsubscribed",
    "Welcome",
    "decode_frame",
    "encode",
    "encode_frame",
    "encode_message",
    "entry_message",
    "encode_str",
    "encode_uv",
    "item_message",
    "iter_messages",
    "push_message",
]
