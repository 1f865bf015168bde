"""Ingest and export runs as Spark applications in cluster deploy mode.

When a task's ``spark`` connection says ``deploy-mode: cluster``, the driver must run on the
cluster, not in the Airflow task. The operator then submits the job's own command line
(``ingest_job.py`` / ``export_job.py``) through the Apache Spark provider's ``SparkSubmitHook``,
which honours the connection's master, queue, principal/keytab, namespace and ``spark-binary``,
and waits for the application:

* **YARN** (master ``yarn``): ``spark-submit`` returns once YARN accepted the application
  (``yarn_track_via_rm_api``: the connection's extra ``yarn_resourcemanager_webapp_address``), and
  the task follows it through the ResourceManager's REST API. The application's id is kept in the
  task state store, so a later try of the task reattaches to a running application instead of
  submitting another one (:func:`run_application`); killing the task kills the application.
* **Kubernetes** (master ``k8s://…``): ``spark-submit`` waits for the driver pod, as the hook does
  by default; a retry submits again (the ingest's fencing and the export's idempotence make a
  second driver harmless).

The outcome is never read from the driver's stdout, which stays on the cluster: the job records
its result, or its failure, in Pravega under a submission id (client/job_results.py).

The Pravega password is on no command line and in no environment the submission sets, where
every user of the host (``ps``) or the cluster's launch context would show it:

* **YARN**: it goes in a file readable by this user only (:data:`PASSWORD_FILE`, in a private
  temporary folder removed as soon as ``spark-submit`` ends), which ``spark-submit --files``
  ships with the application; the job reads it with ``--password-file``.
* **Kubernetes**: the driver pod takes it as ``PRAVEGA_PASSWORD`` from the Kubernetes secret the
  ``spark`` connection's extra ``pravega_password_secret`` names
  (``spark.kubernetes.driver.secretKeyRef``); without one, a password is refused.

The executors get the connection in their tasks' pickled closures, from the driver, as in client mode.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_pravega.client.job_results import JobOutcome, JobResults
from airflow_provider_pravega.spark.connection_args import PASSWORD_ENV, connection_arguments
from airflow_provider_pravega.spark.session import SparkSessionError, spark_target

log = logging.getLogger(__name__)

#: YARN application states in which the application may still finish (the ResourceManager's own).
ACTIVE_STATES = frozenset({"NEW", "NEW_SAVING", "SUBMITTED", "ACCEPTED", "RUNNING"})
#: Seconds between two questions to the ResourceManager while waiting.
POLL_INTERVAL_S = 2.0
#: Failed questions to the ResourceManager in a row before the task gives up waiting.
MAX_POLL_FAILURES = 10
#: The password file's name: ``spark-submit --files`` puts it in each YARN container's working
#: directory, where the job reads it.
PASSWORD_FILE = "pravega-password"
#: The ``spark`` connection's extra naming the Kubernetes secret (``name:key``) with the password.
PASSWORD_SECRET_EXTRA = "pravega_password_secret"


class SparkApplicationError(RuntimeError):
    """A submitted ingest or export application failed; the message says what the job recorded
    (or, when it recorded nothing, what the cluster said)."""


@dataclass(frozen=True)
class Submission:
    """How a task's ``spark`` connection asks for cluster deploy mode."""

    conn_id: str
    master: str
    conf: dict[str, str] = field(default_factory=dict)
    #: Kubernetes: the secret (``name:key``) holding the Pravega password (:data:`PASSWORD_SECRET_EXTRA`).
    password_secret: str | None = None

    @property
    def on_yarn(self) -> bool:
        return self.master.startswith("yarn")


def cluster_submission(spark_conn_id: str | None, spark_conf: dict[str, Any] | None = None) -> Submission | None:
    """The submission the task's Spark connection asks for, or None when the driver runs in the
    task (client deploy mode, Spark Connect, local mode). A cluster deploy mode Spark cannot run
    a Python driver with (a standalone master, a local one) is an error naming the connection."""
    if not spark_conn_id:
        return None
    try:
        target = spark_target(spark_conn_id)
    except SparkSessionError:
        return None  # a missing connection: get_spark_session says what that means for the task
    if target.remote is not None:  # Spark Connect: the server is the cluster's driver already
        return None
    conf = {**target.conf, **{str(k): str(v) for k, v in (spark_conf or {}).items()}}
    mode = str(conf.get("spark.submit.deployMode") or target.deploy_mode or "client").strip().lower()
    if mode != "cluster":
        return None
    master = target.master or ""
    if not (master.startswith("yarn") or master.startswith("k8s://")):
        raise SparkSessionError(
            f"Spark connection {spark_conn_id!r} asks for cluster deploy mode on master {master or 'local'!r}: Spark "
            f"runs a Python driver in cluster deploy mode on YARN and Kubernetes only; use 'deploy-mode': 'client' "
            f"(or no deploy-mode) for this master")
    secret = target.password_secret
    if secret is not None and master.startswith("k8s://"):
        name, sep, key = secret.partition(":")
        if not (sep and name.strip() and key.strip()):
            raise SparkSessionError(
                f"Spark connection {spark_conn_id!r}: extra {PASSWORD_SECRET_EXTRA!r} is {secret!r}; expected "
                f"NAME:KEY, the Kubernetes secret and the key in it holding the Pravega password")
    return Submission(spark_conn_id, master, conf, secret)


class ApplicationRun:
    """One job (``ingest`` or ``export``) submitted as a Spark application and followed to its end.

    ``job_file`` is the job module's file (spark-submit ships it to the cluster), ``job_argv`` its
    command line without the connection's options, ``state_location`` the scope and state stream
    beside which the job records its outcome. The provider must be installed in the Python the
    cluster runs the driver and executors with (``spark.yarn.appMasterEnv.PYSPARK_PYTHON`` and
    ``spark.executorEnv.PYSPARK_PYTHON``, or an archive of an environment). ``password`` is the
    Pravega connection's, which the job finds as the module docstring says (``connection_argv``
    names where)."""

    def __init__(self, submission: Submission, *, kind: str, job_file: str, job_argv: Sequence[str],
                 connection_argv: Sequence[str], password: str | None, state_location: tuple[str, str],
                 client: Any, name: str, sleep: Callable[[float], None] = time.sleep) -> None:
        if password and not submission.on_yarn and not submission.password_secret:
            raise SparkSessionError(
                f"Spark connection {submission.conn_id!r} submits the {kind} to Kubernetes and the Pravega "
                f"connection has a password: name the Kubernetes secret holding it in the Spark connection's "
                f"extra {PASSWORD_SECRET_EXTRA!r} (NAME:KEY, in the application's namespace); the "
                f"password is never put on spark-submit's command line")
        self.submission = submission
        self.kind = kind
        self.job_file = job_file
        self.job_argv = list(job_argv)
        self.connection_argv = list(connection_argv)
        self.password = password
        self.results = JobResults(client, *state_location)
        self.name = name
        self.sleep = sleep
        self.hook: Any = None

    @classmethod
    def of_job(cls, submission: Submission, job: Any, spec: Any, config: Any, client: Any, *, kind: str, name: str,
               lease: bool = False) -> ApplicationRun:
        """The application that runs ``spec`` with the job module ``job`` (``ingest_job`` or
        ``export_job``: its file, its :func:`job_arguments` and its state location) on the
        Pravega connection ``config`` (its password as the module docstring says, never in argv)."""
        connection_argv = connection_arguments(config, lease=lease,
                                               password_file=PASSWORD_FILE if submission.on_yarn else None)
        return cls(submission, kind=kind, job_file=job.__file__, job_argv=job.job_arguments(spec),
                   connection_argv=connection_argv, password=config.password,
                   state_location=job.state_location(spec), client=client, name=name)

    def _hook(self, submission_id: str, application: str | None = None, password_file: str | None = None) -> Any:
        """The Spark provider's hook for the submission; ``password_file`` (YARN) is the local file
        ``spark-submit`` ships with the application (:meth:`_password_file`)."""
        # Airflow only where a task resolves its connection: spark/ imports no Airflow at module level (the jobs run on a cluster without it)
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        conf = {**self.submission.conf, "spark.yarn.tags": f"pravega-submission-{submission_id}"}
        conf.pop("spark.submit.deployMode", None)  # the hook passes --deploy-mode itself
        files = None
        if password_file is not None:  # --files replaces spark.files: keep the connection's
            files = ",".join(f for f in (conf.pop("spark.files", None), password_file) if f)
        if self.password and self.submission.password_secret and not self.submission.on_yarn:
            conf[f"spark.kubernetes.driver.secretKeyRef.{PASSWORD_ENV}"] = self.submission.password_secret
        hook = SparkSubmitHook(
            conn_id=self.submission.conn_id, conf=conf, name=self.name, deploy_mode="cluster", files=files,
            application_args=[*self.connection_argv, *self.job_argv, "--submission", submission_id],
            yarn_track_via_rm_api=self.submission.on_yarn,
        )
        hook._yarn_application_id = application  # a reattached try: on_kill kills this application
        self.hook = hook
        return hook

    @contextmanager
    def _password_file(self) -> Iterator[str | None]:
        """YARN with a password: the password in :data:`PASSWORD_FILE`, readable by this user only,
        in a private temporary folder that is removed when the block ends (``spark-submit`` has
        then uploaded it with the application); else None."""
        if not (self.password and self.submission.on_yarn):
            yield None
            return
        folder = tempfile.mkdtemp(prefix="pravega-submit-")  # mode 0700
        try:
            path = os.path.join(folder, PASSWORD_FILE)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(self.password + "\n")
            yield path
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def submit(self) -> dict[str, str]:
        """Submit the application; its identity (kept in the task state store by the caller)."""
        submission_id = uuid.uuid4().hex
        log.info("submitting the %s as a Spark application (%s, cluster deploy mode), submission %s",
                 self.kind, self.submission.master, submission_id)
        with self._password_file() as password_file:
            hook = self._hook(submission_id, password_file=password_file)
            hook.submit(self.job_file)
        identity = {"submission": submission_id}
        if self.submission.on_yarn:
            if not hook._yarn_application_id:
                raise SparkApplicationError(f"spark-submit did not say which YARN application the {self.kind} is")
            identity["application"] = hook._yarn_application_id
            log.info("%s submitted as YARN application %s", self.kind, identity["application"])
        return identity

    def status(self, identity: dict[str, str]) -> str:
        """``SUCCEEDED`` when the job recorded a result, ``FAILED`` when it can no longer record one
        (or recorded a failure), else the application's YARN state (one of :data:`ACTIVE_STATES`)."""
        outcome = self.results.get(identity["submission"])
        if outcome is not None:
            return "SUCCEEDED" if outcome.ok else "FAILED"
        application = identity.get("application")
        if not application or not self.submission.on_yarn:
            return "FAILED"
        state = self._hook(identity["submission"], application).query_yarn_application_status(application)
        return state if state in ACTIVE_STATES else "FAILED"

    def wait(self, identity: dict[str, str]) -> dict[str, Any]:
        """Wait for the application (YARN; Kubernetes' spark-submit has waited already) and return
        the result the job recorded, or raise :class:`SparkApplicationError`."""
        application = identity.get("application")
        state, diagnostics = "", ""
        if application and self.submission.on_yarn:
            hook = self.hook if self.hook is not None else self._hook(identity["submission"], application)
            failures, last = 0, None
            while True:
                try:
                    state, final, diagnostics = hook._query_yarn_application_status(application)
                except RuntimeError as exc:
                    failures += 1
                    if failures > MAX_POLL_FAILURES:
                        raise SparkApplicationError(f"gave up following YARN application {application}: {exc}") from exc
                    log.warning("the ResourceManager did not answer about %s (%d/%d): %s", application, failures,
                                MAX_POLL_FAILURES, exc)
                    self.sleep(POLL_INTERVAL_S)
                    continue
                failures = 0
                if state != last:
                    log.info("YARN application %s: %s", application, state)
                    last = state
                if state not in ACTIVE_STATES:
                    state = f"{state}/{final}"
                    break
                self.sleep(POLL_INTERVAL_S)
        return self.result(identity, ended=state, diagnostics=diagnostics)

    def result(self, identity: dict[str, str], *, ended: str = "", diagnostics: str = "") -> dict[str, Any]:
        """The result the job recorded under the submission; a recorded failure, or none, raises."""
        outcome: JobOutcome | None = self.results.get(identity["submission"])
        application = identity.get("application") or f"submission {identity['submission']}"
        if outcome is None:
            raise SparkApplicationError(
                f"the {self.kind} application {application} ended{f' {ended}' if ended else ''} without recording "
                f"an outcome (the driver did not start the job or died){f': {diagnostics.strip()}' if diagnostics else ''}"
                f"; see the application's driver log on the cluster")
        if not outcome.ok:
            raise SparkApplicationError(f"the {self.kind} application {application} failed: "
                                        f"{outcome.error_type}: {outcome.error}")
        return outcome.result or {}

    def kill(self) -> None:
        """Kill the application (the task was killed); the hook knows how for each cluster."""
        if self.hook is not None:
            self.hook.on_kill()


def run_application(app: ApplicationRun, store: Any, key: str) -> dict[str, Any]:
    """Run ``app`` to its end and return the job's result. With Airflow's task state store
    (``store``), the application's identity is kept under ``key`` from its submission on: a later
    try of the task reattaches to an application still running, or takes the result of one that
    finished, instead of submitting again. The key is removed when the task has the result."""
    identity = store.get(key) if store is not None else None
    if not (isinstance(identity, dict) and "submission" in identity):
        identity = None  # nothing stored, or what a run in the task's own process keeps
    result = None
    if identity is not None:
        status = app.status(identity)
        if status in ACTIVE_STATES:
            log.info("reattaching to the %s application %s (%s), submitted by an earlier try", app.kind,
                     identity.get("application"), status)
        elif status == "SUCCEEDED":
            log.info("the %s application of an earlier try finished: taking its result", app.kind)
            result = app.result(identity)
        else:
            identity = None  # ended without a result: submit again
    if identity is None:
        identity = app.submit()
        if store is not None:
            store.set(key, identity)
    if result is None:
        result = app.wait(identity)
    if store is not None:
        store.delete(key)
    return result
