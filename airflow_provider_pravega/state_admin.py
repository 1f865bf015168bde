"""The provider's own state in Pravega, for the people who run it: list, inspect, reset, orphans.

The exactly-once ingest and the stream-cut export keep their bookkeeping in their state scope
(``state_scope``; default: the scope of the stream they write or read): ``ingest-state-<digest>``
(a state synchronizer: runs, interval index; its committed files in a table segment beside it) and
``export-state-<digest>`` (recorded cuts per interval). The digests come from the target stream
and the ingest id, or from the export id (with the stream in a state scope; ``dag_id.task_id`` by
default), so renaming a DAG or a task leaves the old state behind: an
orphan, which ``orphans`` finds by comparing the scope's states with the ids (and state scopes) a
DAGs folder's operators use. ``--state-scope`` looks at the states kept in a state scope.

Run: ``python -m airflow_provider_pravega state --help`` (a ``pravega`` connection id, or a
controller URI).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.errors import PravegaError
from airflow_provider_pravega.client.ingest import IngestCoordinator, reset_ingest_state
from airflow_provider_pravega.client.ingest_location import (
    open_state_store,
    state_location,
    state_location as ingest_location,
)
from airflow_provider_pravega.client.ingest_state import REQUESTED
from airflow_provider_pravega.client.synchronizer import StateSynchronizer
from airflow_provider_pravega.protocol.naming import state_stream_prefix
from airflow_provider_pravega.spark.export_spec import ExportSpec
from airflow_provider_pravega.spark.export_state import ExportState, apply_update, state_location as export_location

INGEST_PREFIX = state_stream_prefix("ingest")
EXPORT_PREFIX = state_stream_prefix("export")


@dataclass
class StateSummary:
    """One state stream: what it belongs to and how much it holds."""

    scope: str
    stream: str  # the state's own stream
    kind: str  # "ingest" or "export"
    id: str | None  # the ingest or export id (None: an export state recorded before ids were kept)
    target: str | None  # "scope/stream" it writes or reads (None: not recorded)
    runs: dict[str, int] = field(default_factory=dict)  # ingest: runs by phase ("live" counted apart)
    live_runs: list[str] = field(default_factory=list)  # ingest: runs whose driver still heartbeats
    intervals: int = 0
    completed_runs: int = 0
    last_activity: str | None = None  # ISO time of the newest heartbeat or record seen


def find_states(client: Any, scope: str) -> list[StateSummary]:
    """Every ingest and export state in ``scope``, summarized (no committed-file table is read)."""
    names = sorted(n for n in client.admin.list_streams(scope) if n.startswith((INGEST_PREFIX, EXPORT_PREFIX)))
    return [inspect_state(client, scope, name) for name in names]


def inspect_state(client: Any, scope: str, name: str) -> StateSummary:
    """The summary of state stream ``scope/name``; ValueError when it is not one of ours."""
    if name.startswith(INGEST_PREFIX):
        return _ingest_summary(client, scope, name)
    if name.startswith(EXPORT_PREFIX):
        return _export_summary(client, scope, name)
    raise ValueError(f"{scope}/{name} is not a state of this provider (names start with {INGEST_PREFIX!r} "
                     f"or {EXPORT_PREFIX!r})")


def ingest_state(client: Any, scope: str, name: str) -> dict[str, Any]:
    """The whole state of an ingest (runs, interval index; committed files stay in their table)."""
    with open_state_store(client, scope, name, create=False) as store:
        return store.fetch()


def export_state(client: Any, scope: str, name: str) -> Any:
    """The recorded cuts of an export (``ExportState``)."""
    with StateSynchronizer(client, scope, name, ExportState(), apply_update, create=False) as sync:
        return sync.fetch()


def _ingest_summary(client: Any, scope: str, name: str) -> StateSummary:
    with open_state_store(client, scope, name, create=False) as store:
        state = store.fetch()
        target_scope, _, target_stream = (state.get("target") or f"{scope}/").partition("/")
        # Live as recovery and reset_ingest_state see it: not REQUESTED, and not stale.
        stale = set(IngestCoordinator(store, client.transactions, target_scope, target_stream).stale_runs(state))
    runs = state.get("runs", {})
    newest = max((int(run.get("heartbeat_ms") or 0) for run in runs.values()), default=0)
    return StateSummary(
        scope=scope, stream=name, kind="ingest", id=state.get("ingest_id"), target=state.get("target"),
        runs=dict(Counter(run["phase"] for run in runs.values())),
        live_runs=sorted(rid for rid, run in runs.items() if run["phase"] != REQUESTED and rid not in stale),
        intervals=len(state.get("intervals") or {}), completed_runs=int(state.get("completed_runs") or 0),
        last_activity=_iso(newest) if newest else None,
    )


def _export_summary(client: Any, scope: str, name: str) -> StateSummary:
    state = export_state(client, scope, name)
    stamps = [v.get("at") for v in state.intervals.values() if v.get("at")]
    # The stream's scope is recorded since states may live in a state scope; before, it was the state's own.
    target = f"{state.scope or scope}/{state.stream}" if state.stream else None
    return StateSummary(scope=scope, stream=name, kind="export", id=state.export_id, target=target,
                        intervals=len(state.intervals), last_activity=max(stamps) if stamps else None)


def reset_state(client: Any, scope: str, name: str) -> bool:
    """Forget state ``scope/name``: the next run of its ingest or export starts afresh (an ingest
    then ingests every file again; use it when its target stream was deleted and re-created, or
    for an orphan). An ingest with a live run is refused. False when there was nothing to forget."""
    summary = inspect_state(client, scope, name)
    if summary.kind == "export":
        return client.admin.delete_stream(scope, name, seal=True)
    if summary.id is None or summary.target is None:
        raise ValueError(f"{scope}/{name}: an ingest state without its ingest id or target recorded (an unfinished "
                         f"first use, or an old layout); delete the stream {scope}/{name} itself")
    target_scope, _, target_stream = summary.target.partition("/")
    if state_location(target_scope, target_stream, summary.id, scope) != (scope, name):
        raise ValueError(f"{scope}/{name} is the old layout of ingest {summary.id!r} (adopted by its current state); "
                         f"delete the stream {scope}/{name} itself")
    return reset_ingest_state(client, target_scope, target_stream, summary.id, state_scope=scope)


# ------------------------------------------------------------------------------ orphans


@dataclass(frozen=True)
class ExpectedState:
    """A state a task of a DAGs folder uses: where, and which task."""

    scope: str
    stream: str
    task: str  # "dag_id.task_id"
    kind: str


def expected_states(dags: Iterable[Any], default_scope: str | None = None) -> tuple[list[ExpectedState], list[str]]:
    """The state streams the ingest and export tasks of ``dags`` use (in each task's state scope),
    and the tasks whose state cannot be told before they run (a templated scope, stream, id or
    state scope, or no scope at all)."""
    # import cost: Airflow (about a second) only for orphans; the other commands run on a controller URI alone
    from airflow_provider_pravega.operators.export import PravegaStreamCutExportOperator
    from airflow_provider_pravega.operators.ingest import PravegaTransactionalIngestOperator
    found: list[ExpectedState] = []
    unknown: list[str] = []
    for dag in dags:
        for task in dag.tasks:
            is_ingest = isinstance(task, PravegaTransactionalIngestOperator)
            if not is_ingest and not isinstance(task, PravegaStreamCutExportOperator):
                continue
            name = f"{dag.dag_id}.{task.task_id}"
            scope = task.scope or default_scope
            own_id = (task.ingest_id if is_ingest else task.export_id) or name
            state_scope = task.state_scope or None
            if not scope or any(_templated(v) for v in (scope, task.stream, own_id, state_scope)):
                unknown.append(name)
                continue
            if is_ingest:
                where = ingest_location(scope, task.stream, own_id, state_scope)
            elif task.from_ingest:
                continue  # reads the ingest's interval index: no state of its own
            else:
                where = export_location(ExportSpec(scope, task.stream, "/unused", export_id=own_id,
                                                   state_scope=state_scope))
            found.append(ExpectedState(*where, task=name, kind="ingest" if is_ingest else "export"))
    return found, unknown


def find_orphans(client: Any, scope: str, dags: Iterable[Any], default_scope: str | None = None
                 ) -> tuple[list[StateSummary], list[str]]:
    """The states in ``scope`` that no ingest or export task of ``dags`` uses (a renamed DAG or
    task, a removed one), and the tasks whose state could not be told (see expected_states)."""
    expected, unknown = expected_states(dags, default_scope)
    used = {(e.scope, e.stream) for e in expected}
    return [s for s in find_states(client, scope) if (s.scope, s.stream) not in used], unknown


def load_dags(folder: str) -> list[Any]:
    """The DAGs of a folder, parsed as the dag-processor does. A folder that is missing, cannot be
    read, holds no DAG file or defines no DAG, and an import error, are a ValueError naming the
    folder or file: each would make every state of the scope look like an orphan."""
    path = Path(folder)
    if not path.exists():
        raise ValueError(f"the DAGs folder {folder} does not exist: give the folder the dag-processor parses "
                         f"(its [core] dags_folder)")
    if not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
        raise ValueError(f"the DAGs folder {folder} cannot be read by this user")
    if path.is_dir() and not any(p.suffix in (".py", ".zip") for p in path.rglob("*") if p.is_file()):
        raise ValueError(f"the DAGs folder {folder} holds no DAG file (.py or .zip): give the folder the "
                         f"dag-processor parses (its [core] dags_folder)")
    try:
        # import cost: see expected_states
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow before 3.2
        from airflow.models.dagbag import DagBag  # import cost: see expected_states

    with contextlib.redirect_stdout(sys.stderr):  # Airflow logs the parse on stdout: keep it for our output
        bag = DagBag(dag_folder=folder, safe_mode=False)
    if bag.import_errors:
        first, error = next(iter(bag.import_errors.items()))
        raise ValueError(f"the DAGs folder {folder} does not parse ({len(bag.import_errors)} import error(s)), "
                         f"e.g. {first}: {str(error).strip().splitlines()[-1]}")
    if not bag.dags:
        raise ValueError(f"the DAGs folder {folder} defines no DAG: give the folder the dag-processor parses "
                         f"(its [core] dags_folder)")
    return list(bag.dags.values())


# ----------------------------------------------------------------------------- command line


def _templated(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def _client(args: argparse.Namespace) -> Any:
    if args.controller_uri:
        return PravegaClient(args.controller_uri)
    # import cost: Airflow only for a connection id (see expected_states)
    from airflow_provider_pravega.hooks.pravega import PravegaHook

    return PravegaHook(args.conn_id).get_client()


def _scope_of(args: argparse.Namespace, client: Any) -> str:
    """Where the states are looked for: the state scope when given, else the (user) scope."""
    scope = getattr(args, "state_scope", None) or args.scope or getattr(client.config, "scope", None)
    if not scope:
        raise SystemExit("state: give --scope or --state-scope (the connection has no default scope)")
    return scope


def _line(s: StateSummary) -> str:
    runs = ", ".join(f"{n} {phase.lower()}" for phase, n in sorted(s.runs.items())) or "no runs"
    live = f" ({len(s.live_runs)} live: {', '.join(s.live_runs)})" if s.live_runs else ""
    what = f"{s.kind} {s.id or '(id not recorded)'}"
    into = f" -> {s.target}" if s.kind == "ingest" and s.target else f" of {s.target}" if s.target else ""
    extra = f"; {runs}{live}; {s.completed_runs} done" if s.kind == "ingest" else ""
    return f"{s.stream}  {what}{into}: {s.intervals} interval(s){extra}; last activity {s.last_activity or '-'}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m airflow_provider_pravega state",
                                 description="List, inspect and reset the ingest and export state this provider "
                                             "keeps in Pravega, and find the states no DAG uses any more.")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--conn-id", default="pravega_default", help="the Airflow pravega connection (default)")
    where.add_argument("--controller-uri", help="a controller URI instead of a connection, e.g. tcp://host:9090")
    ap.add_argument("--scope", help="the scope (default: the connection's scope)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    # Accepted before or after the command (state --state-scope S list, or state list --state-scope S).
    state_scope = argparse.ArgumentParser(add_help=False)
    state_scope.add_argument("--state-scope", default=argparse.SUPPRESS,
                             help="look at the states kept in this state scope (the tasks' state_scope) instead of "
                                  "--scope")
    ap.add_argument("--state-scope", help="the scope keeping the states (a task's state_scope; default: --scope)")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", parents=[state_scope], help="every ingest and export state in the scope, one line each")
    show = sub.add_parser("inspect", parents=[state_scope], help="one state in full (runs, intervals and their cuts)")
    show.add_argument("state", help="the state stream, e.g. ingest-state-0123abcd…")
    reset = sub.add_parser("reset", parents=[state_scope],
                           help="forget one state: its next run starts afresh (refused under a live run)")
    reset.add_argument("state")
    reset.add_argument("--yes", action="store_true", help="needed: an ingest reset ingests every file again")
    orphans = sub.add_parser("orphans", parents=[state_scope],
                             help="states no ingest or export task of a DAGs folder uses")
    orphans.add_argument("--dags-folder", required=True, help="the folder the dag-processor parses")
    args = ap.parse_args(argv)

    try:
        # The DAGs first: a wrong folder is refused before anything is asked of Pravega.
        dags = load_dags(args.dags_folder) if args.command == "orphans" else []
        with _client(args) as client:
            scope = _scope_of(args, client)
            return _run(args, client, scope, dags)
    except (PravegaError, ValueError) as exc:
        print(f"state {args.command} failed: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace, client: Any, scope: str, dags: list[Any]) -> int:
    if args.command == "list":
        states = find_states(client, scope)
        if args.json:
            print(json.dumps([asdict(s) for s in states], indent=1))
        else:
            print(f"{len(states)} state(s) in scope {scope}")
            for s in states:
                print("  " + _line(s))
        return 0
    if args.command == "inspect":
        summary = inspect_state(client, scope, args.state)
        detail: dict[str, Any] = {"summary": asdict(summary)}
        if summary.kind == "ingest":
            state = ingest_state(client, scope, args.state)
            detail["runs"] = {rid: {k: v for k, v in run.items() if k != "files"} | {"files": len(run.get("files") or {})}
                              for rid, run in state.get("runs", {}).items()}
            detail["intervals"] = state.get("intervals") or {}
        else:
            state = export_state(client, scope, args.state)
            detail["intervals"] = state.intervals
            detail["last"], detail["pending"] = state.last, state.pending
            detail["outputs"] = state.outputs  # per output path: its claim and cut manifest
        print(json.dumps(detail, indent=1, sort_keys=True, default=str))
        return 0
    if args.command == "reset":
        if not args.yes:
            print(f"state reset: {scope}/{args.state} is forgotten for good (an ingest then ingests every file again); "
                  f"add --yes to do it", file=sys.stderr)
            return 2
        done = reset_state(client, scope, args.state)
        print(f"{scope}/{args.state}: {'reset' if done else 'nothing to reset'}")
        return 0
    orphans, unknown = find_orphans(client, scope, dags,
                                    default_scope=getattr(client.config, "scope", None))
    if args.json:
        print(json.dumps({"orphans": [asdict(s) for s in orphans], "undetermined_tasks": unknown}, indent=1))
    else:
        print(f"{len(orphans)} orphan state(s) in scope {scope} (no task of {args.dags_folder} uses them)")
        for s in orphans:
            print("  " + _line(s))
        if unknown:
            print(f"tasks whose state cannot be told before they run (templated scope, stream or id): "
                  f"{', '.join(unknown)}; a state of theirs may be listed above")
    return 0
