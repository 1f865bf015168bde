"""Where an ingest's state lives and how it is opened: its scope and stream, the checks made before
it is used (write access, a moved or re-created stream), and a state of the old layout adopted."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from typing import Any

from airflow_provider_pravega.client.errors import PravegaPermissionError
from airflow_provider_pravega.client.ingest_errors import IngestError, RecreatedStreamError
from airflow_provider_pravega._clock import now_ms
from airflow_provider_pravega.client.ingest_state import apply_update, initial_state
from airflow_provider_pravega.protocol.naming import state_stream, validate_scope_name

log = logging.getLogger(__name__)


def check_state_scope(state_scope: Any, option: str = "state_scope") -> str | None:
    """``state_scope`` as given when it can name a Pravega scope (None: the target's own scope);
    ValueError naming ``option`` otherwise, before anything is created there."""
    if state_scope is None:
        return None
    if not isinstance(state_scope, str):
        raise ValueError(f"{option} must be a Pravega scope name (or None), got a {type(state_scope).__name__}")
    try:
        return validate_scope_name(state_scope)
    except ValueError as exc:
        raise ValueError(f"{option}={state_scope!r} is not a usable scope for the provider's state: {exc}") from None


@contextlib.contextmanager
def state_scope_access(scope: str, state_scope: str | None) -> Iterator[None]:
    """A permission denied in a state scope of its own (not the target's ``scope``) named as the
    ``state_scope`` option's, with the rights the provider needs there."""
    try:
        yield
    except PravegaPermissionError as exc:
        # the state scope as a whole name ("scope iot-state", "stream iot-state/x"), not inside another
        named = state_scope in {word.rstrip(".") for word in re.split(r"[\s/:,;()'\"]+", f"{exc.resource} {exc.detail}")}
        if not state_scope or state_scope == scope or not named:
            raise
        raise PravegaPermissionError(
            exc.where, exc.user, exc.action, exc.resource,
            f"state_scope {state_scope!r} keeps the provider's state: the user needs READ_UPDATE on "
            f"prn::/scope:{state_scope} and prn::/scope:{state_scope}/*, and the scope must exist or the user be "
            f"allowed to create it" + (f"; {exc.detail}" if exc.detail else ""),
        ) from None


def state_location(scope: str, stream: str, ingest_id: str, state_scope: str | None = None) -> tuple[str, str]:
    """The state of ingest ``ingest_id`` into ``scope/stream`` (see ``state_stream``): its key covers
    scope, stream and id, so targets sharing a state scope never collide."""
    return state_stream("ingest", f"{scope}/{stream}\n{ingest_id}", scope, state_scope)


def legacy_state_location(scope: str, ingest_id: str) -> tuple[str, str]:
    """Where versions before 0.2 kept an ingest's state (keyed by the ingest id only)."""
    return state_stream("ingest", ingest_id, scope)


def check_write_access(client: Any, scope: str, stream: str) -> None:
    """Fail before anything is written when the client's user may not write ``scope/stream``
    (asks the controller for a write delegation token, as a writer would; no-op without auth)."""
    try:
        client.controller.get_delegation_token(scope, stream, "write")
    except PravegaPermissionError as exc:
        raise PravegaPermissionError(
            exc.where, exc.user, "write", f"stream {scope}/{stream}",
            f"no write permission on {scope}/{stream}: ingesting needs READ_UPDATE on the stream and its scope",
        ) from None


def open_state_store(client: Any, scope: str, stream: str, *, create: bool = True) -> Any:
    """The ingest's state synchronizer on ``scope/stream`` (created with one segment if missing),
    with its committed-file table as ``.files`` (created on first use)."""
    # import cost: operators/ingest.py imports this module at DAG parse; the synchronizer (client.batch under it) only when a state is opened
    from airflow_provider_pravega.client.committed_files import CommittedFiles
    from airflow_provider_pravega.client.synchronizer import StateSynchronizer

    store = StateSynchronizer(client, scope, stream, initial_state(), apply_update, create=create)
    store.files = CommittedFiles(client, scope, stream)  # type: ignore[attr-defined]
    return store


def open_ingest_state(client: Any, scope: str, stream: str, ingest_id: str, *, stale_after_s: float = 60.0,
                      state_scope: str | None = None) -> Any:
    """The state of ingest ``ingest_id`` into ``scope/stream``, initialized on first use (kept in
    ``state_scope``, created if missing; default: the target's scope).

    Migration: when this state is new and an old-layout state of the same ingest id exists in the
    scope (not yet adopted by another target), and the target stream already holds data, the old
    state is adopted (it was this stream's); an empty target stream starts fresh (a re-pointed
    ingest ingests its files into the new stream).
    The state belongs to the stream it was first used with: once that stream was deleted and
    re-created, opening it is a RecreatedStreamError (see check_stream_origin).
    """
    location = state_location(scope, stream, ingest_id, state_scope)
    with state_scope_access(scope, state_scope):
        _check_not_moved(client, location, scope, stream, ingest_id)
        store = open_state_store(client, *location)
    try:
        if store.fetch().get("target") is None:
            _init_state(client, store, scope, stream, ingest_id, stale_after_s)
        check_stream_origin(client, store, scope, stream, ingest_id)
    except BaseException:
        store.close()
        raise
    return store


def _check_not_moved(client: Any, location: tuple[str, str], scope: str, stream: str, ingest_id: str) -> None:
    """IngestError (before anything is created) when a new state in a state scope would leave the
    ingest's state in the target's own scope behind: it would know no committed file and ingest
    every file again."""
    own_scope, own_stream = state_location(scope, stream, ingest_id)
    if location == (own_scope, own_stream) or client.admin.stream_exists(*location) or \
            not client.admin.stream_exists(own_scope, own_stream):
        return
    raise IngestError(
        f"ingest {ingest_id!r} into {scope}/{stream} keeps its state in {own_scope}/{own_stream} (the stream's own "
        f"scope), not in state_scope {location[0]!r}: a new state there would ingest every file of the source again. "
        f"Leave state_scope unset for this ingest, or forget the old state (python -m airflow_provider_pravega state "
        f"--scope {own_scope} reset {own_stream} --yes) to start afresh in {location[0]}.")


def _init_state(client: Any, store: Any, scope: str, stream: str, ingest_id: str, stale_after_s: float) -> None:
    target = f"{scope}/{stream}"
    adopted = _legacy_to_adopt(client, scope, stream, ingest_id, stale_after_s)
    store.update(lambda s: None if s.get("target") is not None else
                 {"op": "init", "target": target, "ingest_id": ingest_id, "adopted": adopted})
    if adopted is not None:
        legacy = open_state_store(client, *legacy_state_location(scope, ingest_id), create=False)
        try:
            legacy.update(lambda s: None if s.get("migrated_to") else {"op": "migrated", "to": target})
        finally:
            legacy.close()
        log.info("ingest %s: adopted the state of the old layout (%d committed file(s)) for %s",
                 ingest_id, len(adopted.get("committed", {})), target)


def check_stream_origin(client: Any, store: Any, scope: str, stream: str, ingest_id: str, *,
                        record: bool = True) -> None:
    """RecreatedStreamError when the state in ``store`` was recorded for an earlier stream named
    ``scope/stream``: the origin (:meth:`StreamAdmin.origin`) is recorded when the state is first
    used with the stream, and a state recorded before that adopts the current stream. Without
    ``record`` (readers such as the export) only a recorded origin is compared. A missing stream
    has nothing to compare."""
    if not client.admin.stream_exists(scope, stream):
        return
    changed = client.admin.origin_changed(
        scope, stream, store.fetch().get("origin"),
        (lambda origin: store.update(lambda s: None if s.get("origin") is not None else
                                     {"op": "origin", "origin": origin}).get("origin")) if record else None)
    if changed is None:
        return
    recorded, origin = changed
    raise RecreatedStreamError(
        f"the state of ingest {ingest_id!r} ({store.scope}/{store.stream}) belongs to an earlier stream "
        f"{scope}/{stream}, deleted and re-created since (the state's stream was created with segment(s) "
        f"{', '.join(map(str, recorded))}, the current one with {', '.join(map(str, origin))}). The files it "
        f"recorded as committed, and its interval index, describe the deleted stream: used as they are, they "
        f"would be skipped and never reach the new stream. Forget them with reset_ingest_state(client, "
        f"{scope!r}, {stream!r}, {ingest_id!r}"
        f"{'' if store.scope == scope else f', state_scope={store.scope!r}'}) (airflow_provider_pravega.client.ingest) "
        f"to ingest into the new "
        f"stream, or give this ingest another ingest_id."
    )


def _legacy_to_adopt(client: Any, scope: str, stream: str, ingest_id: str, stale_after_s: float) -> dict | None:
    legacy_scope, legacy_stream = legacy_state_location(scope, ingest_id)
    admin = client.admin
    if not admin.stream_exists(legacy_scope, legacy_stream):
        return None
    legacy = open_state_store(client, legacy_scope, legacy_stream, create=False)
    try:
        state = legacy.fetch()
    finally:
        legacy.close()
    if state.get("migrated_to") or not (state["committed"] or state["runs"]):
        return None
    if not admin.stream_exists(scope, stream) or not any(admin.tail(scope, stream).values()):
        return None  # an empty target cannot hold what the old state recorded: start fresh
    horizon = now_ms() - int(stale_after_s * 1000)
    live = [rid for rid, run in state["runs"].items() if run["heartbeat_ms"] >= horizon]
    if live:
        raise IngestError(
            f"ingest {ingest_id!r} has run(s) {', '.join(live)} in progress under an older version of this provider "
            f"(state {legacy_scope}/{legacy_stream}); let them finish (or wait {stale_after_s:g} s) and re-run"
        )
    return state
