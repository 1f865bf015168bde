"""What a segment store's error replies mean: each as one of the exceptions in :mod:`.errors`.

Every path that talks to a segment store (request/response calls, append sessions, conditional
appends, batch reads, table segments) raises through :func:`raise_for_reply`, so a refusal reads
the same wherever it happens.
"""

from __future__ import annotations

from airflow_provider_pravega.client.connection import access_of
from airflow_provider_pravega.client.controller_types import Endpoint
from airflow_provider_pravega.client.errors import (
    ConditionalAppendFailedError,
    DelegationTokenError,
    NoSuchSegmentError,
    SegmentSealedError,
    SegmentStoreError,
    SegmentTruncatedError,
)
from airflow_provider_pravega.protocol import wire

__all__ = ["raise_for_reply"]


def raise_for_reply(
    reply: wire.Reply,
    *,
    endpoint: Endpoint | str | None = None,
    segment: str | None = None,
    request: wire.Request | None = None,
    user: str | None = None,
) -> None:
    """Raise the exception matching an error reply; return for any other reply. ``request`` and
    ``user`` only make the message of a refused delegation token more precise."""
    if not getattr(reply, "IS_FAILURE", False) and not isinstance(
        reply, wire.ConditionalCheckFailed
    ):
        return
    where = str(endpoint) if endpoint is not None else None
    name = getattr(reply, "segment", None) or segment or "?"
    at = f" at segment store {where}" if where else ""
    if isinstance(reply, wire.NoSuchSegment):
        raise NoSuchSegmentError(
            f"segment {name} does not exist{at}", segment=name, endpoint=where
        )
    if isinstance(reply, wire.SegmentIsSealed):
        raise SegmentSealedError(
            f"segment {name} is sealed{at}; no more appends are possible (stream sealed or scaled, or the "
            f"transaction already ended)",
            segment=name,
            endpoint=where,
        )
    if isinstance(reply, wire.SegmentIsTruncated):
        raise SegmentTruncatedError(
            f"segment {name} is truncated at offset {reply.start_offset}{at}; offset {reply.offset} is gone",
            segment=name,
            endpoint=where,
            start_offset=reply.start_offset,
        )
    if isinstance(reply, wire.AuthTokenCheckFailed):
        if reply.error_code == wire.AUTH_TOKEN_EXPIRED:
            detail = "the delegation token expired and a fresh one was refused too"
        else:
            detail = (
                "the delegation token was refused (check failed: the user lacks this permission on the "
                "stream, or the token was altered or is for another stream)"
            )
        raise DelegationTokenError(
            f"segment store{(' ' + where) if where else ''}", user, _action_of(request), f"segment {name}",
            f"{detail}; error code {reply.error_code}",
        )
    if isinstance(reply, wire.ConditionalCheckFailed):
        raise ConditionalAppendFailedError(
            f"conditional append to {segment or '?'} failed: the segment is not at the expected offset",
            segment=segment,
            endpoint=where,
        )
    if isinstance(reply, wire.WrongHost):
        raise SegmentStoreError(
            f"segment store {where} does not own segment {name} (it points at {reply.correct_host!r})",
            segment=name,
            endpoint=where,
        )
    detail = getattr(reply, "message", "") or getattr(reply, "server_stack_trace", "")
    raise SegmentStoreError(
        f"segment store{at} refused a request on {name}: {type(reply).__name__}{': ' + detail if detail else ''}",
        segment=name,
        endpoint=where,
    )


def _action_of(request: wire.Request | None) -> str:
    if request is None:
        return "use the segment"
    return f"{access_of(request)} ({type(request).__name__})"
