"""``python -m airflow_provider_pravega state``: list, inspect and reset the ingest and export
state in Pravega, a reset refused while an ingest run is live, and the states a DAG rename left
behind found as orphans. The states are made by the coordinator and the export's own recording
(no Spark: the subject is the state, not the data)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from bad_input_doc import check_section

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.ingest import IngestCoordinator
from airflow_provider_pravega.client.ingest_errors import IngestError
from airflow_provider_pravega.client.ingest_location import open_ingest_state
from airflow_provider_pravega.client.ingest_location import state_location as ingest_location
from airflow_provider_pravega.spark.export_spec import ExportSpec
from airflow_provider_pravega.spark.export_state import check_export_origin, open_export_state
from airflow_provider_pravega.spark.export_state import state_location as export_location
from airflow_provider_pravega.state_admin import find_orphans, find_states, inspect_state, load_dags, reset_state

DAG_FILE = """
from datetime import datetime
from airflow.sdk import DAG
from airflow_provider_pravega.operators import PravegaStreamCutExportOperator, PravegaTransactionalIngestOperator

with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 11, 1)):
    PravegaTransactionalIngestOperator(task_id="ingest", scope="{scope}", stream="s", source="/in/*.jsonl")
    PravegaStreamCutExportOperator(task_id="export", scope="{scope}", stream="s", output_path="/out")
    PravegaTransactionalIngestOperator(task_id="templated", scope="{scope}", stream="s", source="/in",
                                       ingest_id="{{{{ params.which }}}}")
"""


def _live_run(client: PravegaClient, scope: str, ingest_id: str) -> tuple[Any, IngestCoordinator, str]:
    """An ingest state with one run that just started (its driver heartbeats: live)."""
    store = open_ingest_state(client, scope, "s", ingest_id)
    coord = IngestCoordinator(store, client.transactions, scope, "s", tail_positions=lambda: {})
    run_id, _plan = coord.start_run({"/in/a.jsonl": {"size": 10, "mtime": 1_790_000_000_000}})
    return store, coord, run_id


def _export_interval(client: PravegaClient, scope: str, export_id: str, interval: str) -> None:
    spec = ExportSpec(scope, "s", "/out", export_id=export_id, interval_key=interval)
    with open_export_state(client, spec) as sync:
        check_export_origin(client, sync, spec)  # records the origin, the export id and the stream
        sync.update(lambda _s: {"op": "interval", "key": interval, "start": "head", "end": "tail",
                                "at": "2026-11-27T00:00:00Z"})
        sync.update(lambda _s: {"op": "output", "path": "/out", "key": interval, "start": "head", "end": "tail"})
        sync.update(lambda _s: {"op": "written", "path": "/out", "events": 3, "bytes": 30, "files": ["part-0"]})


def _cli(uri: str, scope: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_provider_pravega", "state", "--controller-uri", uri,
                           "--scope", scope, *args], capture_output=True, text=True, timeout=300)


def test_list_inspect_and_a_reset_refused_under_a_live_run(pravega_embedded, unique_name) -> None:
    uri = pravega_embedded.controller_uri
    scope = unique_name("states")
    with PravegaClient(uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", 1)
        store, coord, run_id = _live_run(client, scope, "daily.ingest")
        _export_interval(client, scope, "daily.export", "2026-11-01/2026-11-02")
        ingest_name = ingest_location(scope, "s", "daily.ingest")[1]
        export_name = export_location(ExportSpec(scope, "s", "/out", export_id="daily.export"))[1]

        states = {s.stream: s for s in find_states(client, scope)}
        assert set(states) == {ingest_name, export_name}
        ingest, export = states[ingest_name], states[export_name]
        assert (ingest.kind, ingest.id, ingest.target, ingest.live_runs) == ("ingest", "daily.ingest", f"{scope}/s",
                                                                           [run_id])
        assert (export.kind, export.id, export.target, export.intervals) == ("export", "daily.export", f"{scope}/s", 1)

        listed = _cli(uri, scope, "list")
        assert listed.returncode == 0, listed.stderr
        assert f"2 state(s) in scope {scope}" in listed.stdout
        assert "ingest daily.ingest" in listed.stdout and "1 live: " + run_id in listed.stdout
        assert "export daily.export" in listed.stdout and "1 interval(s)" in listed.stdout
        shown = _cli(uri, scope, "inspect", export_name)
        assert json.loads(shown.stdout)["intervals"]["2026-11-01/2026-11-02"]["end"] == "tail"
        assert json.loads(shown.stdout)["outputs"]["/out"] | {"at": None, "written_at": None} == {
            "interval": "2026-11-01/2026-11-02", "start": "head", "end": "tail", "events": 3, "bytes": 30,
            "files": ["part-0"], "at": None, "written_at": None}  # the output's claim and cut manifest
        shown = _cli(uri, scope, "inspect", ingest_name)
        assert json.loads(shown.stdout)["runs"][run_id]["phase"] == "WRITING"

        # A live run: refused, and the state is still there.
        with pytest.raises(IngestError, match=f"live run.*{run_id}"):
            reset_state(client, scope, ingest_name)
        refused = _cli(uri, scope, "reset", ingest_name, "--yes")
        assert refused.returncode == 1 and "wait for them to end" in refused.stderr
        unconfirmed = _cli(uri, scope, "reset", export_name)
        assert unconfirmed.returncode == 2 and "--yes" in unconfirmed.stderr
        assert inspect_state(client, scope, ingest_name).live_runs == [run_id]

        coord.abandon(run_id)  # the run ends: the reset goes through
        store.close()
        assert reset_state(client, scope, ingest_name) is True
        done = _cli(uri, scope, "reset", export_name, "--yes")
        assert done.returncode == 0 and "reset" in done.stdout, done.stderr
        assert find_states(client, scope) == []
        with pytest.raises(ValueError, match="not a state of this provider"):
            inspect_state(client, scope, "s")


def test_a_renamed_dag_leaves_orphans_that_are_found(pravega_embedded, unique_name, tmp_path: Path) -> None:
    uri = pravega_embedded.controller_uri
    scope = unique_name("orphans")
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "daily.py").write_text(textwrap.dedent(DAG_FILE.format(dag_id="daily_v2", scope=scope)))
    with PravegaClient(uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", 1)
        for dag_id in ("daily", "daily_v2"):  # the DAG was renamed from "daily": its states stay behind
            store, coord, run_id = _live_run(client, scope, f"{dag_id}.ingest")
            coord.abandon(run_id)
            store.close()
            _export_interval(client, scope, f"{dag_id}.export", "2026-11-01/2026-11-02")

        orphans, undetermined = find_orphans(client, scope, load_dags(str(dags)))
        assert sorted((o.kind, o.id) for o in orphans) == [("export", "daily.export"), ("ingest", "daily.ingest")]
        assert undetermined == ["daily_v2.templated"]

    found = _cli(uri, scope, "--json", "orphans", "--dags-folder", str(dags))
    assert found.returncode == 0, found.stderr
    report = json.loads(found.stdout)
    assert sorted(o["id"] for o in report["orphans"]) == ["daily.export", "daily.ingest"]
    (dags / "broken.py").write_text("import nothing_of_that_name\n")
    broken = _cli(uri, scope, "orphans", "--dags-folder", str(dags))
    assert broken.returncode == 1 and "does not parse" in broken.stderr and "broken.py" in broken.stderr


STATE_SCOPE_DAG = """
from datetime import datetime
from airflow.sdk import DAG
from airflow_provider_pravega.operators import PravegaStreamCutExportOperator, PravegaTransactionalIngestOperator

with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 11, 1)):
    PravegaTransactionalIngestOperator(task_id="ingest", scope="{scope}", stream="s", source="/in/*.jsonl",
                                       state_scope="{state_scope}")
    PravegaStreamCutExportOperator(task_id="export", scope="{scope}", stream="s", output_path="/out",
                                   state_scope="{state_scope}")
"""


def test_states_kept_in_a_state_scope_are_listed_reset_and_found_orphaned(pravega_embedded, unique_name,
                                                                          tmp_path: Path) -> None:
    """Two user scopes with the same ingest and export ids share one state scope: four states
    there, none in the user scopes; ``--state-scope`` lists, inspects, resets and finds orphans."""
    uri = pravega_embedded.controller_uri
    scopes = [unique_name("user-a"), unique_name("user-b")]
    state_scope = unique_name("pravega-state")
    dags = tmp_path / "dags"
    dags.mkdir()  # the DAG of user-a only: user-b's states are orphans in the state scope
    (dags / "daily.py").write_text(textwrap.dedent(STATE_SCOPE_DAG.format(dag_id="daily", scope=scopes[0],
                                                                          state_scope=state_scope)))
    with PravegaClient(uri) as client:
        names = {}
        for scope in scopes:
            client.admin.create_scope(scope)
            client.admin.create_stream(scope, "s", 1)
            store = open_ingest_state(client, scope, "s", "daily.ingest", state_scope=state_scope)
            coord = IngestCoordinator(store, client.transactions, scope, "s", tail_positions=lambda: {})
            run_id, _plan = coord.start_run({"/in/a.jsonl": {"size": 10, "mtime": 1_790_000_000_000}})
            coord.abandon(run_id)
            store.close()
            spec = ExportSpec(scope, "s", "/out", export_id="daily.export", interval_key="2026-11-01/2026-11-02",
                              state_scope=state_scope)
            with open_export_state(client, spec) as sync:
                check_export_origin(client, sync, spec)
                sync.update(lambda _s: {"op": "interval", "key": "2026-11-01/2026-11-02", "start": "head",
                                        "end": "tail", "at": "2026-11-27T00:00:00Z"})
            names[scope] = (ingest_location(scope, "s", "daily.ingest", state_scope)[1], export_location(spec)[1])
            assert find_states(client, scope) == []  # nothing of ours in the user's scope

        states = {s.stream: s for s in find_states(client, state_scope)}
        assert set(states) == {n for pair in names.values() for n in pair}  # four: no collision
        for scope, (ingest_name, export_name) in names.items():
            assert (states[ingest_name].id, states[ingest_name].target) == ("daily.ingest", f"{scope}/s")
            assert (states[export_name].id, states[export_name].target) == ("daily.export", f"{scope}/s")

        orphans, undetermined = find_orphans(client, state_scope, load_dags(str(dags)))
        assert sorted(o.stream for o in orphans) == sorted(names[scopes[1]]) and undetermined == []

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "airflow_provider_pravega", "state", "--controller-uri", uri,
                               "--scope", scopes[0], *args], capture_output=True, text=True, timeout=300)

    ingest_a, export_a = names[scopes[0]]
    listed = cli("list", "--state-scope", state_scope)
    assert listed.returncode == 0, listed.stderr
    assert f"4 state(s) in scope {state_scope}" in listed.stdout and f"-> {scopes[1]}/s" in listed.stdout
    assert "0 state(s)" in cli("list").stdout  # the user's scope holds none
    shown = cli("inspect", ingest_a, "--state-scope", state_scope)
    assert shown.returncode == 0 and json.loads(shown.stdout)["summary"]["target"] == f"{scopes[0]}/s"
    found = cli("--json", "orphans", "--dags-folder", str(dags), "--state-scope", state_scope)
    assert sorted(o["stream"] for o in json.loads(found.stdout)["orphans"]) == sorted(names[scopes[1]])
    for name in (ingest_a, export_a):
        done = cli("--state-scope", state_scope, "reset", name, "--yes")
        assert done.returncode == 0 and f"{state_scope}/{name}: reset" in done.stdout, done.stderr
    with PravegaClient(uri) as client:
        assert sorted(s.stream for s in find_states(client, state_scope)) == sorted(names[scopes[1]])


def test_a_state_scope_is_refused_while_the_ingest_state_is_in_the_streams_scope(pravega_embedded,
                                                                               unique_name) -> None:
    """Setting state_scope on an existing ingest would start a state knowing no committed file."""
    scope, state_scope = unique_name("moved"), unique_name("pravega-state")
    with PravegaClient(pravega_embedded.controller_uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", 1)
        open_ingest_state(client, scope, "s", "daily.ingest").close()
        with pytest.raises(IngestError, match=f"keeps its state in {scope}/.*not in state_scope '{state_scope}'"):
            open_ingest_state(client, scope, "s", "daily.ingest", state_scope=state_scope)
        assert not client.admin.scope_exists(state_scope)  # refused before anything was created there
        open_ingest_state(client, scope, "s", "daily.ingest").close()  # unchanged, it still opens


def test_a_state_scope_is_refused_while_the_export_state_is_in_the_streams_scope(pravega_embedded,
                                                                               unique_name) -> None:
    """The same for an export: a new state would start 'previous' at the head and forget its intervals."""
    from airflow_provider_pravega.spark.export_spec import ExportError, ExportSpec
    from airflow_provider_pravega.spark.export_state import open_export_state

    scope, state_scope = unique_name("moved"), unique_name("pravega-state")
    spec = ExportSpec(scope, "s", "/unused", export_id="daily.export")
    with PravegaClient(pravega_embedded.controller_uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", 1)
        open_export_state(client, spec).close()
        moved = ExportSpec(scope, "s", "/unused", export_id="daily.export", state_scope=state_scope)
        with pytest.raises(ExportError, match=f"keeps its recorded cuts in {scope}/.*not in state_scope '{state_scope}'"):
            open_export_state(client, moved)
        assert not client.admin.scope_exists(state_scope)  # refused before anything was created there
        fresh = ExportSpec(scope, "s", "/unused", export_id="another.export", state_scope=state_scope)
        open_export_state(client, fresh).close()  # an export with no state yet may start in a state scope


def test_a_dags_folder_that_is_missing_or_holds_no_dag_is_refused_not_read_as_all_orphans(
        pravega_embedded, unique_name, tmp_path: Path) -> None:
    """A mistyped --dags-folder parsed as no DAG at all would make every state of the scope an
    orphan (and invite a reset of states in use): each is an error naming the folder, and the
    command exits 1 before it asks Pravega anything."""
    uri = pravega_embedded.controller_uri
    scope = unique_name("no-dags")
    with PravegaClient(uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", 1)
        _export_interval(client, scope, "daily.export", "2026-11-01/2026-11-02")  # a state in use
    missing = tmp_path / "no" / "such" / "path"
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.md").write_text("the DAGs are elsewhere\n")
    no_dag = tmp_path / "no-dag"
    no_dag.mkdir()
    (no_dag / "helpers.py").write_text("VALUE = 1\n")
    rows = []
    for what, folder, expected in (
            ("`--dags-folder` that does not exist", missing, "does not exist"),
            ("`--dags-folder` without a .py or .zip file", empty, "holds no DAG file"),
            ("`--dags-folder` whose files define no DAG", no_dag, "defines no DAG")):
        with pytest.raises(ValueError, match=expected) as raised:
            load_dags(str(folder))
        assert str(folder) in str(raised.value)
        rows.append((what, "exit 1; `state orphans failed: " + str(raised.value).replace(str(tmp_path), "/data") + "`"))
    refused = _cli(uri, scope, "orphans", "--dags-folder", str(missing))
    assert refused.returncode == 1 and refused.stdout == "", refused.stdout
    assert f"state orphans failed: the DAGs folder {missing} does not exist" in refused.stderr
    check_section("state-admin", "The state command (python -m airflow_provider_pravega state)",
                  "tests/test_state_admin.py", rows,
                  "A DAGs folder that cannot tell which states are in use is refused before Pravega is asked: "
                  "read as no DAG, every state of the scope would be listed as an orphan.")
