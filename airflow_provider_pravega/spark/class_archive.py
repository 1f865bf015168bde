"""A class-data-sharing archive of a local Spark driver's classes: a fresh JVM maps Spark's classes
instead of loading them, so each scheduled run's local session starts seconds sooner.

An Airflow task that runs Spark locally starts a new driver JVM every run, and that JVM spends
most of its start parsing and verifying the same few thousand classes from Spark's jars. A dynamic
CDS archive (JDK 13+: ``-XX:ArchiveClassesAtExit`` once, then ``-XX:SharedArchiveFile``) holds them
ready to map. Measured on 2 cores (a local session, two counts, stop; busy CPU-s of the machine):
11 CPU-s and 9 s without the archive, 6.5 CPU-s and 5 s with it (docs/deployment.md).

:func:`build` makes the archive with a short training job (a session, DataFrames from Python,
Parquet and JSON, Arrow to and from Python workers, a Python data source, a streaming query: what
the provider's jobs do), once per Spark installation and JDK: ``pravega-spark-class-archive build``
in an image's build, or after installing. :func:`java_options` is what
:func:`~airflow_provider_pravega.spark.session.session_defaults` adds to a local session's driver
options when that archive exists. A session that finds none (or one not whole) starts without it,
as it would anyway: the archive is written as a JVM exits, which a task cannot wait for. It starts
the making instead (:func:`start_build`) in a process of its own, detached from the task, niced,
holding the archive's lock and bounded by :data:`BACKGROUND_TIMEOUT_S`, so a later task finds the
archive; ``PRAVEGA_SPARK_CLASS_ARCHIVE`` (:func:`mode`) turns that off.

The archive is a cache, not state: it lives in this host's cache directory (``~/.cache/
airflow-provider-pravega/jvm-class-archives``, or ``$PRAVEGA_SPARK_CLASS_ARCHIVE_DIR``), is keyed
by the JDK, every jar of the Spark installation and the configuration directories on its class
path (``SPARK_CONF_DIR``, ``HADOOP_CONF_DIR``, ...: make it in the tasks' environment), and a JVM that cannot use it (another class
path, another JDK) ignores it silently (``-Xshare:auto``, the JVM's default, with the warning off)
and starts as without it. Archives of installations since changed or removed are deleted when a
new one is made (each is 150-200 MB).

A JVM does not check that an archive is whole: one cut short (an interrupted copy into an image, a
full disk) crashes it as it maps the archive (SIGBUS). So :func:`build` records each archive's size
and digest beside it (the ``.home`` file), a session maps an archive only when its size is the one
recorded (a stat and a small read: microseconds; the digest, a full read of the file, is left to
:func:`build`), and :func:`build` makes again an archive that is not as recorded.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from airflow_provider_pravega import _cache

__all__ = ["SCRIPT", "archive_path", "build", "damage", "java_options", "main", "mode", "start_build"]

log = logging.getLogger(__name__)

#: The console script (``[project.scripts]`` in pyproject.toml) that runs :func:`main`.
SCRIPT = "pravega-spark-class-archive"
#: Where the archives are kept instead of the cache directory (an image's shared location).
DIR_VARIABLE = "PRAVEGA_SPARK_CLASS_ARCHIVE_DIR"
#: How long :func:`build` waits for another process's making of the same archive.
WAIT_FOR_OTHER_S = 300.0
#: The warnings a JVM prints when it cannot use the archive (unified logging, to stdout): off.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: Whether local sessions use and make the archive: ``auto`` (the default: map it, and make it in
#: the background when it is missing or not whole), ``manual`` (map one made by ``build``, never
#: make one) or ``off`` (neither: a read-only worker, or one where a background JVM is unwelcome).
MODE_VARIABLE = "PRAVEGA_SPARK_CLASS_ARCHIVE"
MODES = ("auto", "manual", "off")
#: The module whose ``build --background`` a task starts (run with ``python -m``, as the task's Python).
_MODULE = "airflow_provider_pravega.spark.class_archive"
#: How long a background making may run its training job before it is stopped (and counted failed).
BACKGROUND_TIMEOUT_S = 900.0
#: After a background making failed, tasks start none for this long (``build`` may, any time).
RETRY_AFTER_S = 86400.0
#: The training JVM's options in a background making: C1 only, less CPU beside the tasks (a JVM
#: with both compilers maps the archive all the same).
BACKGROUND_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
#: The niceness a background making adds to itself, its training job and that job's JVM.
BACKGROUND_NICENESS = 10
#: What a task's process may have in its environment that would make the training job's Python
#: join another JVM or a Spark Connect server instead of starting its own driver.
_SESSION_VARIABLES = ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED",
                      "PYSPARK_SUBMIT_ARGS")
# Background makings this process started (kept so that Python reaps them, without a warning).
_started: list[subprocess.Popen] = []


class ClassArchiveError(RuntimeError):
    """The archive could not be made (no Java, no Spark installation, the training job failed)."""


def _java() -> Path | None:
    """The ``java`` spark-class runs: ``$JAVA_HOME/bin/java``, else the first on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return Path(found).resolve() if found and os.path.exists(found) else None


def _spark_home() -> Path | None:
    try:
        # optional: no pyspark here, or a Connect client only (see the except)
        from pyspark.find_spark_home import _find_spark_home

        home = Path(_find_spark_home()).resolve()
    except Exception:  # no pyspark here, or a Spark Connect client only
        return None
    return home if (home / "jars").is_dir() else None


#: What spark-class puts on the driver's class path besides Spark's jars (a JVM maps an archive
#: only when its class path starts with the one the archive was made with).
CLASS_PATH_VARIABLES = ("SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH",
                        "SPARK_CLASSPATH")


def archive_key(java: Path, spark_home: Path) -> str:
    """What an archive is valid for: the JDK binary, every jar of the Spark installation (name,
    size, time) and the environment that adds to the driver's class path, so a reinstall, another
    Spark or another configuration directory gets its own archive."""
    digest = hashlib.sha256()
    stat = java.stat()
    for part in (java, stat.st_mtime_ns, stat.st_size, spark_home, _jars_digest(spark_home),
                 *(os.environ.get(name, "") for name in CLASS_PATH_VARIABLES)):
        digest.update(str(part).encode() + b"\0")
    return digest.hexdigest()[:20]


def _jars_digest(spark_home: Path) -> str:
    """The Spark installation's jars as they are now (name, size, time of each)."""
    digest = hashlib.sha256()
    for jar in sorted((spark_home / "jars").glob("*.jar")):
        jar_stat = jar.stat()
        digest.update(f"{jar.name}:{jar_stat.st_size}:{jar_stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def cache_dir() -> Path:
    return _cache.cache_dir("jvm-class-archives", DIR_VARIABLE)


def archive_path(java: Path | None = None, spark_home: Path | None = None) -> Path | None:
    """Where this JDK's and Spark installation's archive is (or would be); ``None`` without either."""
    java = java or _java()
    spark_home = spark_home or _spark_home()
    if java is None or spark_home is None:
        return None
    return cache_dir() / f"spark-{archive_key(java, spark_home)}.jsa"


def mode() -> str:
    """:data:`MODE_VARIABLE` as one of :data:`MODES`; another value is warned about and taken as
    ``manual`` (no background JVM, which is what a misspelt ``off`` meant to avoid)."""
    raw = os.environ.get(MODE_VARIABLE, "").strip().lower() or "auto"
    if raw in MODES:
        return raw
    log.warning("%s=%r is none of %s: taken as 'manual' (an archive made by `%s build` is used, none is made "
                "in the background)", MODE_VARIABLE, raw, ", ".join(MODES), SCRIPT)
    return "manual"


def java_options(archive: Path | None = None) -> str:
    """The driver options that map ``archive`` (by default this installation's), or ``""`` when
    there is none, or when it is not whole (a warning names it: a JVM would crash mapping it), or
    when :func:`mode` is ``off``. Without a whole archive, ``auto`` starts making it in the
    background (:func:`start_build`) for the sessions after this one."""
    chosen = mode()
    if chosen == "off":
        return ""
    own = archive is None  # this installation's, which start_build makes
    try:
        archive = archive or archive_path()
    except OSError:
        return ""
    if archive is None:
        return ""
    why = damage(archive) if archive.is_file() else None
    if why is None and archive.is_file():
        return f"-XX:SharedArchiveFile={archive} {QUIET}"
    builder = start_build() if chosen == "auto" and own else None
    if why is not None:
        then = (f"the making started in the background replaces it (log: {log_path(archive)})" if builder is not None
                else f"`{SCRIPT} build` makes it again")
        log.warning("not using the class archive %s: %s; local Spark sessions start without it until %s",
                    archive, why, then)
    return ""


def log_path(archive: Path) -> Path:
    """The output of the latest background making of ``archive``, beside it."""
    return archive.with_suffix(".log")


def _failed_path(archive: Path) -> Path:
    """Beside ``archive`` while its latest background making failed: why, and when (its mtime)."""
    return archive.with_suffix(".failed")


def _lock_path(archive: Path) -> Path:
    """What a making of ``archive`` holds locked (``flock``) while it runs."""
    return archive.parent / (archive.name + ".lock")


def start_build(training: Path | None = None) -> int | None:
    """Start making this installation's archive in the background, unless it is whole, another
    process is making it, a background making of it failed less than :data:`RETRY_AFTER_S` ago, or
    its directory cannot be written; the making's pid, else None.

    The making is ``python -m ...class_archive build --background FD``: a new session (a task's
    end or kill does not end it), niced, its output in :func:`log_path`, its training job stopped
    after :data:`BACKGROUND_TIMEOUT_S`. This process takes the archive's lock before it starts it
    and hands it the locked file (``FD``), so two tasks noticing at once start one making, and no
    task starts another while it runs. ``training``: a script to run instead of the built-in
    training job (``build --training``)."""
    try:
        archive = archive_path()
    except OSError:
        return None
    if archive is None or (archive.is_file() and damage(archive) is None):
        return None
    try:
        failed_at = _failed_path(archive).stat().st_mtime
    except OSError:
        failed_at = None
    if failed_at is not None and time.time() - failed_at < RETRY_AFTER_S:
        log.info("not making the class archive %s in the background: the last try failed (see %s); tasks try "
                 "again %.0f h after it, `%s build` any time", archive, log_path(archive), RETRY_AFTER_S / 3600, SCRIPT)
        return None
    try:
        archive.parent.mkdir(parents=True, exist_ok=True)
        lock = open(_lock_path(archive), "a")
    except OSError as exc:
        log.info("cannot make the class archive in the background: its directory %s cannot be written (%s); "
                 "set %s=manual (or %s to a writable directory)", archive.parent, exc.strerror or exc,
                 MODE_VARIABLE, DIR_VARIABLE)
        return None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # another process is making it
        if archive.is_file() and damage(archive) is None:  # made by the making that held the lock
            return None
        command = [sys.executable, "-m", _MODULE, "build", "--background", str(lock.fileno())]
        if training is not None:
            command += ["--training", str(training)]
        try:
            with open(log_path(archive), "w") as output:
                builder = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                           pass_fds=(lock.fileno(),), start_new_session=True, cwd=archive.parent)
        except OSError as exc:
            log.info("could not start making the class archive %s in the background: %s", archive, exc)
            return None
    _started.append(builder)
    log.info("making the class archive %s in the background (pid %d, log %s): local Spark sessions start from it "
             "once it is made", archive, builder.pid, log_path(archive))
    return builder.pid


def _record_path(archive: Path) -> Path:
    """Beside each archive: its Spark installation and that installation's jars (for
    :func:`_remove_stale`), and the archive's size and digest as made (for :func:`damage`)."""
    return archive.with_suffix(".home")


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _write_record(archive_file: Path, record: Path, spark_home: Path) -> None:
    """Record ``archive_file`` (whole: its JVM has exited) as the archive ``record`` belongs to."""
    record.write_text(f"{spark_home}\n{_jars_digest(spark_home)}\n{archive_file.stat().st_size}\n"
                      f"{_digest(archive_file)}\n")


def damage(archive: Path, full: bool = False) -> str | None:
    """Why ``archive`` cannot be mapped: not the size :func:`build` recorded (cut short), no record
    of its making, or (``full``: the whole file is read) another digest; ``None`` when it is whole."""
    try:
        lines = _record_path(archive).read_text().splitlines()
        size = archive.stat().st_size
    except OSError as exc:
        return f"no record of its making ({exc.strerror or exc})"
    if len(lines) < 4 or not lines[2].isdigit():
        return f"no record of its size in {_record_path(archive)} (made by an earlier version)"
    if size != int(lines[2]):
        return f"it is {size} bytes where {int(lines[2])} were written (cut short or replaced since)"
    if full and _digest(archive) != lines[3]:
        return "its content is not what was written (its digest differs)"
    return None


# The work whose classes the archive holds: a session, DataFrames from Python, Parquet and JSON
# written and read, Arrow to and from Python workers, a Python data source, and a streaming query
# with a checkpoint: what the provider's jobs do, without a Pravega server.
_TRAINING = r'''
import sys
from pathlib import Path
from pyspark import SparkContext
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader

work = Path(sys.argv[1])

class Training(DataSource):
    @classmethod
    def name(cls):
        return "pravega_class_archive_training"
    def schema(self):
        return "id long, event binary"
    def reader(self, schema):
        return _Reader()

class _Reader(DataSourceReader):
    def read(self, partition):
        for i in range(10):
            yield (i, b"e%d" % i)

spark = (SparkSession.builder.master("local[2]").appName("pravega-class-archive")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.execution.arrow.pyspark.enabled", "true").getOrCreate())
gateway = SparkContext._gateway
df = spark.createDataFrame([(i, b"e%d" % i) for i in range(100)], "id long, event binary")
df.write.mode("overwrite").parquet(str(work / "parquet"))
assert spark.read.parquet(str(work / "parquet")).count() == 100
df.selectExpr("id", "cast(event as string) as text").write.mode("overwrite").json(str(work / "json"))
assert len(spark.read.json(str(work / "json")).collect()) == 100
assert df.mapInArrow(lambda batches: batches, df.schema).count() == 100
spark.dataSource.register(Training)
assert spark.read.format("pravega_class_archive_training").load().count() == 10
query = (spark.readStream.schema(df.schema).parquet(str(work / "parquet")).writeStream
         .format("parquet").option("path", str(work / "stream"))
         .option("checkpointLocation", str(work / "checkpoint")).trigger(availableNow=True).start())
query.awaitTermination()
spark.stop()
# The archive is written as the JVM exits: end it (spark-submit's JVM exits when its stdin closes)
# and wait, so the file is whole when this process ends (a JVM that failed writing it exits non-zero).
proc = getattr(gateway, "proc", None)
if proc is not None:
    proc.stdin.close()
    if proc.wait(timeout=300) != 0:
        sys.exit(f"the driver JVM exited with {proc.returncode} while writing the archive")
'''


def _train(java_options: str, timeout_s: float, training: Path | None = None) -> subprocess.CompletedProcess:
    """Run the training job (``training``, else the built-in one) in a fresh Python whose Spark
    driver JVM gets ``java_options``, and wait for that JVM to exit."""
    with tempfile.TemporaryDirectory(prefix="pravega-class-archive-") as work:
        script = Path(work) / "train.py"
        script.write_text(training.read_text() if training is not None else _TRAINING)
        env = {**os.environ, "SPARK_SUBMIT_OPTS": java_options, "PYSPARK_PYTHON": sys.executable}
        for name in _SESSION_VARIABLES:
            env.pop(name, None)
        return subprocess.run([sys.executable, str(script), work], env=env, capture_output=True,
                              text=True, timeout=timeout_s)


def build(base_options: str = "", *, timeout_s: float = 300.0, training: Path | None = None,
          lock: IO[str] | None = None) -> Path:
    """This JDK's and Spark installation's archive, made now unless it exists (or is being made by
    another process, which this one then waits for). ``base_options``: the driver options the
    training JVM runs with besides the archive's; ``training``: a script to run instead of the
    built-in training job; ``lock``: the archive's lock file, locked already by the process that
    started this one (:func:`start_build`). :class:`ClassArchiveError` says why none could be made."""
    java, spark_home = _java(), _spark_home()
    if java is None:
        raise ClassArchiveError("no java: set JAVA_HOME or put java on PATH (Spark needs it too)")
    if spark_home is None:
        raise ClassArchiveError("no Spark installation with jars here (is pyspark installed, not only pyspark-client?)")
    directory = cache_dir()
    archive = directory / f"spark-{archive_key(java, spark_home)}.jsa"
    if archive.exists() and damage(archive, full=True) is None:
        _failed_path(archive).unlink(missing_ok=True)
        return archive
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = lock or open(_lock_path(archive), "w")
    except OSError as exc:
        raise ClassArchiveError(f"cannot write the archive's directory {directory} ({exc.strerror or exc}): "
                                f"make it writable, or set {DIR_VARIABLE} to a directory that is") from None
    with lock:
        deadline = time.monotonic() + WAIT_FOR_OTHER_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ClassArchiveError(f"another process has been making {archive} for "
                                            f"{WAIT_FOR_OTHER_S:.0f} s (lock {lock.name})") from None
                time.sleep(1.0)
        if archive.exists():  # made by the process that held the lock, or not whole
            why = damage(archive, full=True)
            if why is None:
                return archive
            print(f"{SCRIPT}: replacing {archive}: {why}", file=sys.stderr, flush=True)
            archive.unlink()  # a JVM mapping it keeps its copy until it exits
        _remove_stale(directory)
        for left in directory.glob(f"{archive.stem}.*.partial"):  # of makings killed midway (this one holds the lock)
            left.unlink(missing_ok=True)
        partial = archive.with_suffix(f".{os.getpid()}.partial")
        options = f"{base_options} -XX:ArchiveClassesAtExit={partial} {QUIET}".strip()
        try:
            result = _train(options, timeout_s, training)
        except subprocess.TimeoutExpired:
            partial.unlink(missing_ok=True)
            raise ClassArchiveError(f"the training job did not end within {timeout_s:.0f} s") from None
        if result.returncode != 0 or not partial.exists() or partial.stat().st_size == 0:
            partial.unlink(missing_ok=True)
            raise ClassArchiveError(f"the training job failed (exit {result.returncode}); its last output:\n"
                                    f"{result.stderr[-3000:]}")
        _write_record(partial, _record_path(archive), spark_home)
        os.replace(partial, archive)
        _failed_path(archive).unlink(missing_ok=True)
        return archive


def _build_in_background(lock_fd: int, training: Path | None) -> int:
    """``build --background``: what :func:`start_build` runs, holding the archive's lock
    (``lock_fd``, inherited) until it exits: its last words in the log and a failure's record
    beside the archive (:func:`_failed_path`, so tasks do not start it again every run) are
    written before any task may start another."""
    try:
        os.nice(BACKGROUND_NICENESS)
    except OSError:
        pass
    archive = archive_path()
    print(f"{SCRIPT}: pid {os.getpid()}, making {archive} in the background (training job stopped after "
          f"{BACKGROUND_TIMEOUT_S:.0f} s)", flush=True)
    started = time.monotonic()
    try:
        made = build(BACKGROUND_JAVA_OPTIONS, timeout_s=BACKGROUND_TIMEOUT_S, training=training,
                     lock=os.fdopen(os.dup(lock_fd), "w"))  # build closes its copy; lock_fd stays locked
    except (ClassArchiveError, OSError) as exc:
        print(f"{SCRIPT}: {exc}", flush=True)
        if archive is not None:
            _failed_path(archive).write_text(f"{exc}\n")
            print(f"{SCRIPT}: tasks start no other making of it for {RETRY_AFTER_S / 3600:.0f} h; "
                  f"`{SCRIPT} build` makes it any time", flush=True)
        return 1
    print(f"{SCRIPT}: {made} ({made.stat().st_size / 2**20:.0f} MiB) made in {time.monotonic() - started:.0f} s",
          flush=True)
    return 0


def _remove_stale(directory: Path) -> None:
    """Delete the archives of Spark installations that are gone, or whose jars changed since (the
    ``.home`` file beside each names its installation and its jars then). An archive of the same
    installation for another environment or JDK stays: another process may be using it. A JVM
    still mapping a deleted one keeps it until it exits."""
    for archive in directory.glob("spark-*.jsa"):
        home_file = _record_path(archive)
        try:
            home_text, jars = (home_file.read_text().splitlines() + ["", ""])[:2]
            home = Path(home_text)
            current = (home / "jars").is_dir() and jars == _jars_digest(home)
        except OSError:
            current = False
        if not current:
            for path in (archive, home_file, _lock_path(archive), log_path(archive), _failed_path(archive)):
                path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=SCRIPT, description="Make or show the class-data-sharing archive that local Spark sessions "
                                 "of this installation start from (docs/deployment.md).")
    parser.add_argument("command", choices=("build", "show"), nargs="?", default="show")
    parser.add_argument("--java-options", default="",
                        help="build: more options for the training JVM (e.g. -XX:TieredStopAtLevel=1 to spend less "
                             "CPU making it; the archive is the same)")
    parser.add_argument("--training", type=Path, default=None,
                        help="build: run this Python script as the training job instead of the built-in one (its "
                             "argument: a scratch directory; the JVM it starts must get SPARK_SUBMIT_OPTS, which "
                             "holds the archive's options, and must have exited when the script ends)")
    # What start_build runs: the making, holding the archive's lock (this inherited descriptor).
    parser.add_argument("--background", type=int, default=None, metavar="FD", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.command == "show":
        archive = archive_path()
        if archive is None:
            print("no archive possible here: no java or no Spark installation with jars")
            return 1
        why = damage(archive) if archive.is_file() else "not made yet"
        state = f"{archive.stat().st_size / 2**20:.0f} MiB" if why is None else why
        with_mode = f"; {MODE_VARIABLE}={mode()}"
        print(f"{archive} ({state}{with_mode}); a local session adds: "
              f"{java_options(archive) if why is None else '(nothing until it is made)'}")
        if why is not None and _failed_path(archive).is_file():
            print(f"the last background making failed: see {log_path(archive)}")
        return 0 if why is None else 1
    if args.background is not None:
        return _build_in_background(args.background, args.training)
    print(f"{SCRIPT}: running a short Spark job to record the classes a local session loads "
          "(about a minute on 2 cores) ...", flush=True)
    started = time.monotonic()
    try:
        archive = build(args.java_options, training=args.training)
    except ClassArchiveError as exc:
        print(f"{SCRIPT}: {exc}", file=sys.stderr)
        return 1
    print(f"{SCRIPT}: {archive} ({archive.stat().st_size / 2**20:.0f} MiB) in "
          f"{time.monotonic() - started:.0f} s; local sessions of this installation now start from it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
