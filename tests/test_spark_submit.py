"""Cluster deploy mode without a cluster: which connections submit an application, the job command
lines an operator hands the application (the inverse of the jobs' own parsers), and the outcome a
job records in Pravega under its submission id (what the task reads instead of the driver's
stdout). The YARN scenarios themselves are in tests/lake/test_yarn.py."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from bad_input_doc import check_section

from airflow_provider_pravega.client import PravegaClient
from airflow_provider_pravega.client.config import PravegaConnectionConfig
from airflow_provider_pravega.client.job_results import JobResults
from airflow_provider_pravega.spark import export_job, ingest_job
from airflow_provider_pravega.spark.connection_args import connection_arguments
from airflow_provider_pravega.spark.ingest_spec import IngestSpec
from airflow_provider_pravega.spark.session import SparkSessionError
from airflow_provider_pravega.spark.submit import ApplicationRun, SparkApplicationError, cluster_submission


def _spark_conn(monkeypatch, name: str, **conn) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{name.upper()}", json.dumps(conn))
    return name


def test_which_connections_submit_an_application(monkeypatch) -> None:
    yarn = _spark_conn(monkeypatch, "yarn_cluster", conn_type="spark", host="yarn",
                       extra={"deploy-mode": "cluster", "queue": "etl", "conf": {"spark.executor.memory": "2g"}})
    submission = cluster_submission(yarn, {"spark.executor.instances": "3"})
    assert submission is not None and submission.on_yarn
    assert submission.conf == {"spark.yarn.queue": "etl", "spark.executor.memory": "2g", "spark.executor.instances": "3"}
    k8s = _spark_conn(monkeypatch, "k8s_cluster", conn_type="spark", host="k8s://https://api.example:6443",
                      extra={"namespace": "etl"})
    assert cluster_submission(k8s) is None  # client mode unless asked
    assert cluster_submission(k8s, {"spark.submit.deployMode": "cluster"}).master == "k8s://https://api.example:6443"
    client_mode = _spark_conn(monkeypatch, "yarn_client", conn_type="spark", host="yarn", extra={"deploy-mode": "client"})
    assert cluster_submission(client_mode) is None
    connect = _spark_conn(monkeypatch, "connect", conn_type="spark_connect", host="sc://127.0.0.1", port=15002)
    assert cluster_submission(connect) is None
    assert cluster_submission(None) is None
    standalone = _spark_conn(monkeypatch, "standalone_cluster", conn_type="spark", host="spark://127.0.0.1:7077",
                             extra={"deploy-mode": "cluster"})
    with pytest.raises(SparkSessionError, match="'standalone_cluster'.*YARN and Kubernetes only"):
        cluster_submission(standalone)


def test_connection_arguments_keep_the_password_out_of_argv(monkeypatch, tmp_path: Path) -> None:
    import argparse

    from airflow_provider_pravega.spark.connection_args import add_connection_arguments, config_from_arguments

    config = PravegaConnectionConfig.from_connection_fields(
        host="tls://c1:9090,c2:9091", login="writer", password="s3cret",
        extra={"trust_store": "/etc/ca.pem", "validate_hostname": False, "transaction_lease_ms": 45000})
    parser = argparse.ArgumentParser()
    add_connection_arguments(parser, lease=True)
    argv = connection_arguments(config, lease=True)
    assert "s3cret" not in " ".join(argv) and "--password-file" not in argv
    monkeypatch.setenv("PRAVEGA_PASSWORD", "s3cret")
    assert config_from_arguments(parser.parse_args(argv)) == config
    monkeypatch.delenv("PRAVEGA_PASSWORD")
    (tmp_path / "pw").write_text("s3cret\n")
    argv = connection_arguments(config, lease=True, password_file=str(tmp_path / "pw"))
    assert "s3cret" not in " ".join(argv)
    assert config_from_arguments(parser.parse_args(argv)) == config
    missing = connection_arguments(config, password_file=str(tmp_path / "gone"))
    with pytest.raises(ValueError, match="--password-file '.*gone': cannot read the password: No such file"):
        config_from_arguments(parser.parse_args(missing))


def test_bearer_credentials_travel_as_the_password_does(monkeypatch, tmp_path: Path) -> None:
    """A keycloak.json in the connection reaches the jobs (environment or password file) and the data
    source's tasks (their options) the way a password does; its path alone goes on the command line."""
    import argparse

    from airflow_provider_pravega.spark.connection_args import add_connection_arguments, config_from_arguments
    from airflow_provider_pravega.spark.datasource import connection_config, connection_options

    keycloak_json = json.dumps({"realm": "r", "auth-server-url": "https://kc", "resource": "app",
                                "credentials": {"secret": "kc-s3cret"}}, indent=2)
    config = PravegaConnectionConfig.from_connection_fields(host="tcp://c1:9090", password=keycloak_json,
                                                            extra={"auth_method": "Bearer"})
    parser = argparse.ArgumentParser()
    add_connection_arguments(parser)
    argv = connection_arguments(config)
    assert "kc-s3cret" not in " ".join(argv) and argv[-2:] == ["--auth-method", "Bearer"]
    monkeypatch.setenv("PRAVEGA_PASSWORD", config.password)
    assert config_from_arguments(parser.parse_args(argv)) == config
    monkeypatch.delenv("PRAVEGA_PASSWORD")
    (tmp_path / "pw").write_text(config.password + "\n")  # one line: the password file's first line
    argv = connection_arguments(config, password_file=str(tmp_path / "pw"))
    assert "kc-s3cret" not in " ".join(argv)
    assert config_from_arguments(parser.parse_args(argv)) == config
    assert connection_config(connection_options(config)) == config

    by_path = PravegaConnectionConfig.from_connection_fields(host="tcp://c1:9090",
                                                             extra={"keycloak_file": "/etc/pravega/keycloak.json"})
    argv = connection_arguments(by_path, password_file=str(tmp_path / "pw"))
    assert argv[-4:] == ["--auth-method", "Bearer", "--keycloak-file", "/etc/pravega/keycloak.json"]
    assert config_from_arguments(parser.parse_args(argv)) == by_path
    assert connection_config(connection_options(by_path)) == by_path


def test_job_arguments_give_the_jobs_the_same_spec(monkeypatch, tmp_path: Path) -> None:
    """What the operator builds is what the job's own parser reads back, option for option."""
    seen = []
    monkeypatch.setattr(ingest_job, "run_ingest", lambda client, spark, spec: seen.append(spec) or
                        {"ingested": True})
    monkeypatch.setattr(export_job, "run_export", lambda client, spark, spec, local_files: seen.append(spec) or
                        {"exported": True})
    argv = connection_arguments(PravegaConnectionConfig.from_connection_fields(host="tcp://127.0.0.1:1"))
    ingest = IngestSpec(
        scope="sc", stream="s", source=[str(tmp_path / "a b.jsonl"), "hdfs://nn/x/*.csv"], format="csv",
        routing_key_field="k", payload_field="p", ingest_id="daily", create_stream=True, stream_segments=3,
        on_empty="succeed", allow_changed_files=True, wait_for_commit=False, num_writers=4, stale_after_s=12.5,
        unknown_commits="committed", remember_files_for_s=86400.0, interval_key="2026-11-20/2026-11-21",
        state_scope="st", task_instance="d/t/r/-1", try_number=2)
    export = export_job.ExportSpec(
        scope="sc", stream="s", output_path="hdfs://nn/out", start_cut="head", end_cut="tail", format="jsonl",
        event_format="json", export_id="e", interval_key="2026-11-20/2026-11-21", on_truncated="head",
        num_partitions=5, json_schema="a string, b double", compression="gzip", state_scope="st")
    table = export_job.ExportSpec(scope="sc", stream="s", table="lake.events", format="delta", export_id="x",
                                  interval_key="2026-11-20/2026-11-21", from_ingest="daily", ingest_state_scope="st")
    monkeypatch.setattr(ingest_job, "run_job_command", lambda name, args, job, failures, state_location: job(None) and 0)
    monkeypatch.setattr(export_job, "run_job_command", lambda name, args, job, failures, state_location: job(None) and 0)
    ingest_job.main([*argv, *ingest_job.job_arguments(ingest)])
    export_job.main([*argv, *export_job.job_arguments(export)])
    export_job.main([*argv, *export_job.job_arguments(table)])
    assert seen == [ingest, export, table]


def test_a_submitted_ingest_records_its_outcome_in_pravega(tmp_path: Path, pravega_embedded, unique_name) -> None:
    """The ingest's command line, as the operator builds it, run the way the cluster runs it:
    its result, then a failure, recorded under the submission id (no JVM: nothing to ingest)."""
    scope = unique_name("sub")
    spec = IngestSpec(scope=scope, stream="s", source=str(tmp_path / "none-*.jsonl"), create_stream=True,
                                 on_empty="succeed", ingest_id="daily", interval_key="2026-11-20/2026-11-21",
                                 state_scope=f"{scope}-state")
    with PravegaClient(pravega_embedded.controller_uri) as client:
        config = PravegaConnectionConfig.from_connection_fields(host=pravega_embedded.controller_uri)
        argv = connection_arguments(config, lease=True)
        assert ingest_job.main([*argv, *ingest_job.job_arguments(spec), "--submission", "ok-1"]) == 0
        outcome = JobResults(client, *ingest_job.state_location(spec)).get("ok-1")
        assert outcome.ok and outcome.result["files_ingested"] == [] and outcome.result["run_id"] is None
        failing = IngestSpec(scope=scope, stream="s", source=str(tmp_path / "none-*.jsonl"),
                                        ingest_id="daily", state_scope=f"{scope}-state")
        assert ingest_job.main([*argv, *ingest_job.job_arguments(failing), "--submission", "bad-1"]) == 1
        failed = JobResults(client, *ingest_job.state_location(failing)).get("bad-1")
        assert not failed.ok and "none-*.jsonl" in failed.error and failed.error_type
        assert JobResults(client, *ingest_job.state_location(spec)).get("never") is None

        run = ApplicationRun(cluster_submission_stub(), kind="ingest", job_file=ingest_job.__file__, job_argv=[],
                             connection_argv=[], password=None, state_location=ingest_job.state_location(spec),
                             client=client, name="t")
        assert run.result({"submission": "ok-1"})["files_ingested"] == []
        assert run.status({"submission": "ok-1"}) == "SUCCEEDED"
        assert run.status({"submission": "bad-1"}) == "FAILED"
        with pytest.raises(SparkApplicationError, match="ingest application submission bad-1 failed: .*none-"):
            run.result({"submission": "bad-1"})
        with pytest.raises(SparkApplicationError, match="application_1_0001 ended FAILED/FAILED without recording "
                                                        "an outcome.*AM container exited"):
            run.result({"submission": "never", "application": "application_1_0001"}, ended="FAILED/FAILED",
                       diagnostics="AM container exited with code 2")


def test_a_submitted_export_records_its_outcome(tmp_path: Path, pravega_embedded, unique_name) -> None:
    """An empty range exported by the export's command line as the operator builds it (no JVM)."""
    scope = unique_name("sub")
    with PravegaClient(pravega_embedded.controller_uri) as client:
        client.admin.create_scope(scope)
        client.admin.create_stream(scope, "s", 2)
        spec = export_job.ExportSpec(scope=scope, stream="s", output_path=str(tmp_path / "out"), format="jsonl",
                                     export_id="daily", interval_key="2026-11-20/2026-11-21", start_cut="head")
        argv = connection_arguments(PravegaConnectionConfig.from_connection_fields(
            host=pravega_embedded.controller_uri))
        assert export_job.main([*argv, *export_job.job_arguments(spec), "--submission", "e-1"]) == 0
        outcome = JobResults(client, *export_job.state_location(spec)).get("e-1")
        assert outcome.ok and outcome.result["events"] == 0 and outcome.result["interval"] == spec.interval_key


def cluster_submission_stub():
    from airflow_provider_pravega.spark.submit import Submission

    return Submission("yarn_cluster", "yarn")


def test_yarn_cluster_mode_without_the_resourcemanager_address_fails_before_submitting(
    monkeypatch, pravega_embedded, tmp_path: Path,
) -> None:
    """The task follows a YARN application through the ResourceManager: without its address in the
    connection, the submission is refused at once, naming the extra to set (no spark-submit runs)."""
    conn = _spark_conn(monkeypatch, "yarn_no_rm", conn_type="spark", host="yarn", extra={"deploy-mode": "cluster"})
    monkeypatch.setenv("PATH", str(tmp_path))  # no spark-submit anywhere: it must not be needed to fail
    with PravegaClient(pravega_embedded.controller_uri) as client:
        run = ApplicationRun(cluster_submission(conn), kind="ingest", job_file=ingest_job.__file__, job_argv=[],
                             connection_argv=[], password=None, state_location=("sc", "st"), client=client, name="t")
        with pytest.raises(ValueError, match="yarn_resourcemanager_webapp_address"):
            run.submit()


SECRET = "k8s-and-yarn-Pa55"


def _run_with_password(monkeypatch, conn: str, client) -> ApplicationRun:
    config = PravegaConnectionConfig.from_connection_fields(host="tcp://127.0.0.1:1", login="writer", password=SECRET)
    spec = IngestSpec(scope="sc", stream="s", source="hdfs://nn/in/*.jsonl", ingest_id="daily")
    return ApplicationRun.of_job(cluster_submission(conn), ingest_job, spec, config, client, kind="ingest",
                                 name="pravega-ingest-d.t", lease=True)


def test_on_kubernetes_the_password_comes_from_the_named_secret(monkeypatch, pravega_embedded) -> None:
    """The command line spark-submit would run names the secret, never the password."""
    from airflow.providers.apache.spark.hooks import spark_submit

    # The hook refuses a k8s:// master unless the cncf.kubernetes provider (not installed here)
    # imported; building the command line does not use it.
    monkeypatch.setattr(spark_submit, "kube_client", object(), raising=False)
    conn = _spark_conn(monkeypatch, "k8s_cluster", conn_type="spark", host="k8s://https://api.example:6443",
                       extra={"deploy-mode": "cluster", "namespace": "etl",
                              "pravega_password_secret": "pravega-writer:password"})
    with PravegaClient(pravega_embedded.controller_uri) as client:
        run = _run_with_password(monkeypatch, conn, client)
        with run._password_file() as path:
            assert path is None  # nothing written: the cluster has the secret
            command = run._hook("sub-1")._build_spark_submit_command(run.job_file)
        assert SECRET not in " ".join(command)
        assert "spark.kubernetes.driver.secretKeyRef.PRAVEGA_PASSWORD=pravega-writer:password" in command
        assert "--password-file" not in command and command[command.index("--username") + 1] == "writer"
        assert not any("driverEnv" in arg or "appMasterEnv" in arg for arg in command)



def test_on_yarn_the_password_goes_in_a_private_file_removed_after_spark_submit(
    monkeypatch, pravega_embedded, tmp_path: Path,
) -> None:
    """spark-submit ships the password file with the application (``--files``, beside the
    connection's own ``spark.files``); the file is the user's alone and gone once spark-submit
    ended, even when it failed (here: no spark-submit on PATH). The cluster's side is
    tests/lake/test_yarn.py."""
    import stat

    conn = _spark_conn(monkeypatch, "yarn_files", conn_type="spark", host="yarn",
                       extra={"deploy-mode": "cluster", "yarn_resourcemanager_webapp_address": "http://127.0.0.1:1",
                              "conf": {"spark.files": "hdfs://nn/lookup.csv"}})
    monkeypatch.setenv("PATH", str(tmp_path))
    with PravegaClient(pravega_embedded.controller_uri) as client:
        run = _run_with_password(monkeypatch, conn, client)
        with run._password_file() as path:
            command = run._hook("sub-1", password_file=path)._build_spark_submit_command(run.job_file)
            assert Path(path).read_text() == SECRET + "\n"
            assert stat.S_IMODE(Path(path).stat().st_mode) == 0o600
            assert stat.S_IMODE(Path(path).parent.stat().st_mode) == 0o700
        assert not Path(path).parent.exists()
        assert SECRET not in " ".join(command)
        assert command[command.index("--files") + 1] == f"hdfs://nn/lookup.csv,{path}"
        assert not any(arg.startswith("spark.files=") or "appMasterEnv" in arg for arg in command)
        assert command[command.index("--password-file") + 1] == "pravega-password"
        made = set(Path(tempfile.gettempdir()).glob("pravega-submit-*"))
        with pytest.raises(FileNotFoundError):
            run.submit()
        assert set(Path(tempfile.gettempdir()).glob("pravega-submit-*")) <= made


def test_credentials_a_submission_cannot_pass_are_refused(monkeypatch, pravega_embedded, tmp_path: Path) -> None:
    """Kubernetes without a secret for the password, a secret named without its key, a job's
    password file it cannot read: each a clear error before anything runs (docs/bad-input.md)."""
    import argparse

    from airflow_provider_pravega.spark.connection_args import add_connection_arguments, config_from_arguments

    k8s = {"conn_type": "spark", "host": "k8s://https://api.example:6443"}
    bare = _spark_conn(monkeypatch, "k8s_bare", **k8s, extra={"deploy-mode": "cluster"})
    with PravegaClient(pravega_embedded.controller_uri) as client:
        with pytest.raises(SparkSessionError,
                           match="'k8s_bare'.*has a password.*'pravega_password_secret'") as no_secret:
            _run_with_password(monkeypatch, bare, client)
    bad = _spark_conn(monkeypatch, "k8s_bad", **k8s,
                      extra={"deploy-mode": "cluster", "pravega_password_secret": "no-key"})
    with pytest.raises(SparkSessionError, match="'k8s_bad'.*'pravega_password_secret' is 'no-key'.*NAME:KEY") \
            as no_key:
        cluster_submission(bad)
    parser = argparse.ArgumentParser()
    add_connection_arguments(parser)
    gone = tmp_path / "gone"
    with pytest.raises(ValueError, match="--password-file '.*gone': cannot read the password: No such file") as no_file:
        config_from_arguments(parser.parse_args(["--controller-uri", "tcp://c:9090", "--username", "u",
                                                 "--password-file", str(gone)]))
    rows = [
        ("Kubernetes cluster deploy mode, a Pravega password, no `pravega_password_secret` in the `spark` connection",
         f"`SparkSessionError`: {no_secret.value}"),
        ('`pravega_password_secret`: `"no-key"`', f"`SparkSessionError`: {no_key.value}"),
        ("a job's `--password-file` that cannot be read",
         f"`ValueError` (exit 2): {str(no_file.value).replace(str(tmp_path), '/data')}"),
    ]
    check_section("cluster-credentials", "Credentials of a submitted application", "tests/test_spark_submit.py", rows,
                  "Each before spark-submit runs (or, for the job, before it connects).")
