"""A streamed response's body written at once, without a coroutine per piece, under uvicorn.

ASGI hands a response its body through ``await send(message)``: a coroutine per
piece, and under uvicorn a dozen checks before the one ``transport.write``. A
streamed token is a piece of a few hundred bytes, so that call is a good part of
what the gateway spends per token. ``body_writer`` recognises uvicorn's
httptools cycle behind a ``send`` and gives a plain function that writes one
chunk of the chunked body straight to the connection's transport, and returns
False instead when it must not: the client is gone, the connection closes, or the
client reads slower than tokens arrive (uvicorn's flow control paused writing).
The caller then uses ``send``, which waits for the client to catch up.

The response must have sent its start through ``send`` first (uvicorn chose the
chunked encoding then), and ends through ``send`` as usual (the last, empty chunk).
Any other server, or uvicorn's h11 implementation, gets None: everything goes
through ``send``.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import Send

try:
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
except ImportError:  # httptools missing, or a uvicorn that moved it: everything through send
    RequestResponseCycle = None  # type: ignore[assignment,misc]

BodyWriter = Callable[[bytes], bool]
# What the writer reads of uvicorn's cycle. Internals, not API: a release without them
# gets no writer (and tests/gateway/test_body_writer.py fails), not a broken stream.
_USED = ("transport", "flow", "disconnected")


def body_writer(send: Send) -> BodyWriter | None:
    """A synchronous writer of body chunks for the response behind ``send``, if it can have one."""
    cycle = getattr(send, "__self__", None)
    if RequestResponseCycle is None or not isinstance(cycle, RequestResponseCycle):
        return None
    if getattr(cycle, "chunked_encoding", None) is not True or not all(
        hasattr(cycle, name) for name in _USED
    ):
        return None
    transport, flow = cycle.transport, cycle.flow
    if not hasattr(flow, "write_paused"):
        return None

    def write(data: bytes) -> bool:
        """Write ``data`` as one chunk now; False (nothing written) when ``send`` must."""
        if flow.write_paused or cycle.disconnected or transport.is_closing():
            return False
        try:
            transport.write(b"%x\r\n%s\r\n" % (len(data), data))
        except (OSError, RuntimeError):
            # The caller is the result reader, handing over other streams' events too:
            # it must not fail. ``send`` meets the same broken transport and reports it.
            return False
        return True

    return write
