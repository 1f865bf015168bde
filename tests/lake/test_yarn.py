"""A PySpark application on a real YARN (Hadoop's MiniYARNCluster over a MiniDFSCluster, see
pravega_testing.yarn), submitted as a user's scheduler would: pyspark's ``spark-submit --master
yarn --deploy-mode cluster``. The driver runs in the ApplicationMaster's container and two
executors in theirs, all launched by the NodeManager; the application reads a file from the
cluster's HDFS, counts its rows on the executors and writes the count back. The ResourceManager
reports it FINISHED/SUCCEEDED, and once the cluster stops no container process is left."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pravega_testing.hdfs import HdfsUnavailable
from pravega_testing.yarn import (Yarn, alive, applications, container_processes, processes_under, read_file, role,
                                  spark_submit_command, submit_env, write_file, yarn_minicluster)

APP = '''\
import sys

from pyspark.sql import SparkSession

spark = SparkSession.builder.appName("yarn-smoke").getOrCreate()
source, target = sys.argv[1], sys.argv[2]
rows = spark.sparkContext.textFile(source, 4).filter(lambda line: line.strip()).count()
spark.sparkContext.parallelize([str(rows)], 1).saveAsTextFile(target)
spark.stop()
'''


@dataclass
class Cluster:
    yarn: Yarn
    #: Container processes the test saw (pid -> role); the fixture checks they are gone after stop.
    seen: dict[int, str | None] = field(default_factory=dict)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("yarn")
    try:
        with yarn_minicluster(work) as yarn:
            state = Cluster(yarn)
            yield state
    except HdfsUnavailable as exc:
        pytest.skip(str(exc))
    left = [pid for pid in state.seen if alive(pid)] + [pid for pid, _cmd in processes_under(work)]
    assert not left, f"processes left after the cluster stopped: {left}"


def test_pyspark_application_in_cluster_mode(cluster: Cluster, tmp_path: Path) -> None:
    yarn = cluster.yarn
    write_file(yarn, "/smoke/rows.txt", b"".join(b"row %d\n" % i for i in range(1000)) + b"\n")
    app = tmp_path / "count_rows.py"
    app.write_text(APP)
    tag = f"smoke-{uuid.uuid4().hex[:8]}"
    cmd = spark_submit_command(yarn, app, f"{yarn.hdfs_uri}/smoke/rows.txt", f"{yarn.hdfs_uri}/smoke/count",
                               conf={"spark.yarn.tags": tag, "spark.yarn.maxAppAttempts": "1"})
    log = tmp_path / "spark-submit.log"
    started = time.monotonic()
    with log.open("wb") as out:
        submit = subprocess.Popen(cmd, env=submit_env(yarn), stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, cwd=tmp_path, start_new_session=True)
        try:
            while submit.poll() is None:
                assert time.monotonic() - started < 300, "spark-submit did not finish within 300 s"
                cluster.seen.update((pid, role(cmdline)) for pid, cmdline in container_processes(yarn))
                time.sleep(0.5)
        finally:
            if submit.poll() is None:
                os.killpg(submit.pid, 9)
                submit.wait()
    elapsed = time.monotonic() - started
    apps = applications(yarn, tag)
    assert submit.returncode == 0, f"spark-submit failed ({submit.returncode}) in {elapsed:.0f} s: " \
                                   f"{apps}\n{log.read_text(errors='replace')[-4000:]}"
    assert [(a["state"], a["finalStatus"]) for a in apps] == [("FINISHED", "SUCCEEDED")], apps
    assert read_file(yarn, "/smoke/count/part-00000") == b"1000\n"
    # The driver ran in the ApplicationMaster's container, the rows were counted in two executors'.
    roles = sorted(r for r in cluster.seen.values() if r)
    assert roles == ["driver", "executor", "executor"], cluster.seen
    print(f"cluster-mode submission: {elapsed:.1f} s end to end, {apps[0]['elapsedTime'] / 1000:.1f} s in YARN")
