"""The ``service_tier`` a job's response says, written into all the worker writes for it
(pure, no I/O): every streamed event, and the whole body.

The tier is the one of the band the job ran in (``broker.ServiceTiers.tier_of``). The
worker writes a job's output once, to its result stream; the gateway relays those bytes
as they are, to the stream's client and to every resumption, and the batch worker copies
the body into the batch's output line. Stamping here is thus one splice per written piece
for all of them, and no JSON parsing of a streamed event: every event the engine's
accounting passes on (``workers.engine``) is ``data: {...}\\n\\n``, one JSON object (never
an empty one: an engine's chunk has at least its id), and raw newlines cannot occur
inside JSON, so each ``}\\n\\n`` is an object's end and the member goes before its brace.
A usual piece costs a byte search and a replace. An event that has a ``service_tier``
already (an engine that sends its own; vLLM streams none) gets its value replaced
instead (one whose value is not null or a name gets the member after it: the last of
two wins with JSON parsers). A whole body, one per job, is parsed and dumped again
(vLLM's holds ``"service_tier":null``).
"""

from __future__ import annotations

import re

import orjson

from broker import ServiceTiers, Settings

_END = b"}\n\n"
_MARK = b'"service_tier":'
# The member as an engine writes it: its value is null or a tier's name (no escapes).
_MEMBER = re.compile(rb'"service_tier":(?:null|"[^"\\]*")')


class TierStamp:
    """Writes one tier into a job's events and body."""

    __slots__ = ("_end", "_member", "tier")

    def __init__(self, tier: str) -> None:
        self.tier = tier
        self._member = _MARK + orjson.dumps(tier)
        self._end = b"," + self._member + _END

    def events(self, events: bytes) -> bytes:
        """Complete ``data: {...}`` events, each with the tier as its ``service_tier``."""
        if _MARK not in events:
            return events.replace(_END, self._end)
        return b"".join(self._event(e) for e in events.split(b"\n\n")[:-1])

    def _event(self, event: bytes) -> bytes:
        if _MARK in event:
            stamped, found = _MEMBER.subn(lambda _: self._member, event, count=1)
            if found:
                return stamped + b"\n\n"
        return event[:-1] + self._end

    def response_events(self, events: bytes) -> bytes:
        """A Responses stream's events with the tier in the response they carry: its
        ``service_tier`` (``response.created``, ``response.completed``, ...) replaced; the
        other events are relayed unchanged (theirs is no field of theirs)."""
        if _MARK not in events:
            return events
        return _MEMBER.sub(lambda _: self._member, events)

    def body(self, body: bytes) -> bytes:
        """A whole JSON body with the tier as its ``service_tier``."""
        parsed = orjson.loads(body)  # an object: ``workers.engine.complete`` refuses others
        parsed["service_tier"] = self.tier
        return orjson.dumps(parsed)


class TierStamps:
    """The stamp of each band, made once per worker from the settings."""

    __slots__ = ("_by_band", "_unnamed")

    def __init__(self, settings: Settings) -> None:
        tiers = ServiceTiers.of(settings)
        self._by_band = {band: TierStamp(tiers.tier_of(band)) for band in settings.bands}
        # A band this worker's settings lack (configurations out of step): says "default".
        self._unnamed = TierStamp(tiers.tier_of(""))

    def of(self, band: str) -> TierStamp:
        return self._by_band.get(band, self._unnamed)
