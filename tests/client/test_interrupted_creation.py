"""A stream whose creation was cut off by a lost controller or segment store.

Pravega 0.13 writes the stream's metadata first, with state CREATING, then creates its segments and
sets it ACTIVE. When that second part fails the stream stays CREATING: ``checkStreamExists`` lists
it, every call on it answers INTERNAL "State: CREATING", and only a new ``createStream`` finishes it,
with the configuration first given (``StreamMetadataTasks.createStreamBody``, EXISTS_CREATING). Seen
on the real cluster on 2026-11-29, with a stream created while a restarted segment store took its
containers back.

The embedded server never leaves a stream half made: it creates the segments before the record
that makes the stream visible. ``_CutsOffCreation`` below makes it answer as Pravega does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client import controller as controller_module
from airflow_provider_pravega.client.errors import ControllerError, ControllerUnreachableError
from airflow_provider_pravega.embedded import server as server_module
from airflow_provider_pravega.embedded.controller import EmbeddedController
from airflow_provider_pravega.protocol import controller_pb2 as pb


class _CutsOffCreation(EmbeddedController):
    """Creates the streams named in ``cut_off`` only half: the create answers FAILURE and the
    stream refuses calls as CREATING until the next create of it, which answers STREAM_EXISTS."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cut_off: set[tuple[str, str]] = set()
        self.half_made: set[tuple[str, str]] = set()
        self.creates_fail = False  # as while its own tables' containers recover: INTERNAL

    def createStream(self, request: pb.StreamConfig, context: grpc.ServicerContext) -> pb.CreateStreamStatus:
        key = (request.streamInfo.scope, request.streamInfo.stream)
        if self.creates_fail:
            context.abort(grpc.StatusCode.INTERNAL, "StoreConnectionException: addNewEntry")
        if key in self.half_made:  # Pravega's EXISTS_CREATING: segments made, state ACTIVE
            self.half_made.discard(key)
            return pb.CreateStreamStatus(status=pb.CreateStreamStatus.STREAM_EXISTS)
        answer = super().createStream(request, context)
        if key in self.cut_off and answer.status == pb.CreateStreamStatus.SUCCESS:
            self.cut_off.discard(key)
            self.half_made.add(key)
            return pb.CreateStreamStatus(status=pb.CreateStreamStatus.FAILURE)
        return answer

    def getCurrentSegments(self, request: pb.StreamInfo, context: grpc.ServicerContext) -> pb.SegmentRanges:
        if (request.scope, request.stream) in self.half_made:
            context.abort(grpc.StatusCode.INTERNAL, f"Stream: {request.stream} State: CREATING")
        return super().getCurrentSegments(request, context)


@pytest.fixture
def cut_off(pravega_cluster_factory: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, PravegaClient]]:
    """An in-process embedded server with ``_CutsOffCreation`` as its controller, and a client."""
    monkeypatch.setattr(server_module, "EmbeddedController", _CutsOffCreation)
    monkeypatch.setattr(controller_module, "STREAM_CREATING_WAIT_S", 0.3)
    server = pravega_cluster_factory(segment_stores=1)
    assert isinstance(server.controller, _CutsOffCreation)
    with PravegaClient(server.controller_uri) as client:
        yield server.controller, client


def test_ensure_stream_finishes_a_stream_whose_creation_was_cut_off(cut_off: tuple[Any, PravegaClient]) -> None:
    controller, client = cut_off
    client.admin.create_scope("sc")
    controller.cut_off.add(("sc", "st"))
    with pytest.raises(ControllerError):
        client.admin.create_stream("sc", "st", 3)
    assert client.admin.stream_exists("sc", "st")  # listed, yet refused:
    with pytest.raises(ControllerError, match=r"sc/st: the stream was still being created after 0.3 s; .*"
                                              r"creating it again finishes it \(StreamAdmin.ensure_stream"):
        client.controller.get_current_segments("sc", "st")

    assert client.admin.ensure_stream("sc", "st", 3) is False  # it existed: finished, not created
    assert [r.segment_id for r in client.controller.get_current_segments("sc", "st")] == [0, 1, 2]
    assert client.admin.ensure_stream("sc", "st", 3) is False  # and again: nothing changes
    assert client.admin.ensure_stream("sc", "new", 2) is True


def test_ensure_stream_takes_a_listed_stream_as_it_is_when_the_controller_cannot_create_now(
    cut_off: tuple[Any, PravegaClient],
) -> None:
    """Reads wait for a recovering controller, changes do not: opening a state must not fail where
    checking that its stream exists used to be enough. A missing stream still fails."""
    controller, client = cut_off
    client.admin.create_scope("sc")
    client.admin.create_stream("sc", "st", 2)
    controller.creates_fail = True
    assert client.admin.ensure_stream("sc", "st", 2) is False
    assert len(client.controller.get_current_segments("sc", "st")) == 2
    with pytest.raises((ControllerError, ControllerUnreachableError)):
        client.admin.ensure_stream("sc", "missing", 2)


def test_ensure_stream_creates_a_missing_scope_only_when_asked(cut_off: tuple[Any, PravegaClient]) -> None:
    from airflow_provider_pravega.client.errors import ScopeNotFoundError

    _, client = cut_off
    with pytest.raises(ScopeNotFoundError):
        client.admin.ensure_stream("nowhere", "st")
    assert client.admin.ensure_stream("somewhere", "st", create_scope=True) is True
    assert client.admin.scope_exists("somewhere")


def test_a_state_stream_cut_off_in_creation_is_finished_by_the_next_try(cut_off: tuple[Any, PravegaClient]) -> None:
    """A task's first try is lost while it creates its ingest state; the retry opens the state, where
    creating the stream only when missing left it refused for good."""
    from airflow_provider_pravega.client.ingest_location import open_ingest_state, state_location

    controller, client = cut_off
    client.admin.create_scope("iot")
    client.admin.create_stream("iot", "readings", 2)
    controller.cut_off.add(state_location("iot", "readings", "daily"))
    with pytest.raises(ControllerError):  # the first try
        open_ingest_state(client, "iot", "readings", "daily")
    assert controller.half_made

    store = open_ingest_state(client, "iot", "readings", "daily")  # the retry
    try:
        assert not controller.half_made
        assert store.fetch()["runs"] == {}
    finally:
        store.close()
