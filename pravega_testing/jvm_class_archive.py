"""A class-data-sharing archive of a local Spark driver's classes, made once per Spark install and
JDK, for the suite's many short-lived Spark JVMs.

A fresh local Spark session spends most of its start parsing and verifying the same few thousand
classes from Spark's jars. With those classes in a dynamic CDS archive (JDK 13+:
``-XX:ArchiveClassesAtExit`` once, then ``-XX:SharedArchiveFile``) a JVM maps them instead.
Measured on 2 cores (a session, two counts, stop; busy CPU-s of the machine): 11 CPU-s and 9 s
without, 6.5 CPU-s and 5 s with. The suite starts some hundreds of such JVMs, so it is a test
speed-up, not a product default (where the product's own sessions keep the JVM's own start).

The archive is a cache: a JVM whose class path or JDK does not match it ignores it (``-Xshare:auto``,
the default), and its warning is off, so a stale or foreign archive costs nothing but its speed-up.
It lives in the project's cache (``~/.cache/airflow-provider-pravega/jvm-class-archives``), keyed by the JDK and the Spark install's jars; the suite's two
parts and the interpreter tiers start at once, so one process makes it under a file lock while the
others wait for it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from airflow_provider_pravega import _cache

#: Turn the archive off for one run (``0``): every JVM then starts as Spark ships it.
DISABLE_VARIABLE = "PRAVEGA_TEST_CLASS_ARCHIVE"
#: How long a process waits for another one's making of the archive before going on without it.
WAIT_FOR_OTHER_S = 300.0
#: The warnings a JVM prints when it cannot use the archive (unified logging, to stdout): off.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _java() -> Path | None:
    """The ``java`` spark-class runs: ``$JAVA_HOME/bin/java``, else the first on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return Path(found).resolve() if found and os.path.exists(found) else None


def _spark_home() -> Path | None:
    try:
        from pyspark.find_spark_home import _find_spark_home

        return Path(_find_spark_home()).resolve()
    except Exception:  # no pyspark here: nothing to archive
        return None


def archive_key(java: Path, spark_home: Path) -> str:
    """What the archive is valid for: the JDK binary and every jar of the Spark install (name,
    size, time), so a reinstall or another Spark gets its own archive."""
    digest = hashlib.sha256()
    for part in (java, java.stat().st_mtime_ns, java.stat().st_size, spark_home):
        digest.update(str(part).encode() + b"\0")
    for jar in sorted((spark_home / "jars").glob("*.jar")):
        stat = jar.stat()
        digest.update(f"{jar.name}:{stat.st_size}:{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:20]


def cache_dir() -> Path:
    return _cache.cache_dir("jvm-class-archives")


# The work whose classes the archive holds: a session, DataFrames from Python, Parquet and JSON
# written and read, Arrow to and from Python workers, a Python data source, and a streaming query
# with a checkpoint: what the suite's Spark jobs do, without a Pravega server.
_TRAINING = r'''
import sys
from pathlib import Path
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader

work = Path(sys.argv[1])

class Training(DataSource):
    @classmethod
    def name(cls):
        return "jvm_class_archive_training"
    def schema(self):
        return "id long, event binary"
    def reader(self, schema):
        return _Reader()

class _Reader(DataSourceReader):
    def read(self, partition):
        for i in range(10):
            yield (i, b"e%d" % i)

spark = (SparkSession.builder.master("local[2]").appName("jvm-class-archive")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.execution.arrow.pyspark.enabled", "true").getOrCreate())
df = spark.createDataFrame([(i, b"e%d" % i) for i in range(100)], "id long, event binary")
df.write.mode("overwrite").parquet(str(work / "parquet"))
assert spark.read.parquet(str(work / "parquet")).count() == 100
df.selectExpr("id", "cast(event as string) as text").write.mode("overwrite").json(str(work / "json"))
assert len(spark.read.json(str(work / "json")).collect()) == 100
assert df.mapInArrow(lambda batches: batches, df.schema).count() == 100
spark.dataSource.register(Training)
assert spark.read.format("jvm_class_archive_training").load().count() == 10
query = (spark.readStream.schema(df.schema).parquet(str(work / "parquet")).writeStream
         .format("parquet").option("path", str(work / "stream"))
         .option("checkpointLocation", str(work / "checkpoint")).trigger(availableNow=True).start())
query.awaitTermination()
from pyspark import SparkContext
gateway = SparkContext._gateway
spark.stop()
# The archive is written as the JVM exits: end it (spark-submit's JVM exits when its stdin closes)
# and wait, so the file is whole when this process ends.
proc = getattr(gateway, "proc", None)
if proc is not None:
    proc.stdin.close()
    proc.wait(timeout=120)
'''


def _train(java_options: str, timeout_s: float) -> subprocess.CompletedProcess:
    """Run the training job in a fresh Python whose Spark JVM gets ``java_options``, and wait
    for that JVM to exit (it writes the archive as it exits)."""
    with tempfile.TemporaryDirectory(prefix="jvm-class-archive-") as work:
        script = Path(work) / "train.py"
        script.write_text(_TRAINING)
        env = {**os.environ, "SPARK_SUBMIT_OPTS": java_options, "PYSPARK_PYTHON": sys.executable}
        env.pop("PYSPARK_SUBMIT_ARGS", None)
        return subprocess.run([sys.executable, str(script), work], env=env, capture_output=True,
                              text=True, timeout=timeout_s)


def ensure_archive(base_options: str, *, timeout_s: float = 300.0) -> Path | None:
    """The archive for this JDK and Spark install, made now if missing (by this process, or by
    another one holding the lock while this one waits); ``None`` when it cannot be had (no Java,
    no pyspark, the training job failed: the JVMs then start without it)."""
    java, spark_home = _java(), _spark_home()
    if java is None or spark_home is None or not (spark_home / "jars").is_dir():
        return None
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    archive = directory / f"spark-{archive_key(java, spark_home)}.jsa"
    if archive.exists():
        return archive
    _remove_stale(directory, java)
    with open(directory / (archive.name + ".lock"), "w") as lock:
        deadline = time.monotonic() + WAIT_FOR_OTHER_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return None
                time.sleep(1.0)
        if archive.exists():  # made by the process that held the lock
            return archive
        partial = archive.with_suffix(f".{os.getpid()}.partial")
        partial.unlink(missing_ok=True)
        try:
            result = _train(f"{base_options} -XX:ArchiveClassesAtExit={partial} {QUIET}", timeout_s)
        except subprocess.TimeoutExpired:
            partial.unlink(missing_ok=True)
            return None
        if result.returncode != 0 or not partial.exists() or partial.stat().st_size == 0:
            sys.stderr.write(f"jvm_class_archive: no archive made (exit {result.returncode}); Spark JVMs "
                             f"start without one:\n{result.stderr[-2000:]}\n")
            partial.unlink(missing_ok=True)
            return None
        archive.with_suffix(".home").write_text(str(spark_home))
        os.replace(partial, archive)
        return archive


def _remove_stale(directory: Path, java: Path) -> None:
    """Delete the archives of Spark installs that are gone or changed since (each CI checkout
    installs its own): at 150-200 MB each they would pile up. A JVM still mapping one keeps it."""
    for archive in directory.glob("spark-*.jsa"):
        home_file = archive.with_suffix(".home")
        try:
            home = Path(home_file.read_text().strip())
            current = home.is_dir() and archive.name == f"spark-{archive_key(java, home)}.jsa"
        except OSError:
            current = False
        if not current:
            for path in (archive, home_file, directory / (archive.name + ".lock")):
                path.unlink(missing_ok=True)


def with_archive(base_options: str) -> str:
    """``base_options`` plus the archive's options, or ``base_options`` alone when the archive is
    turned off or cannot be had."""
    if os.environ.get(DISABLE_VARIABLE, "1") == "0":
        return base_options
    archive = ensure_archive(base_options)
    if archive is None:
        return base_options
    return f"{base_options} -XX:SharedArchiveFile={archive} {QUIET}"
