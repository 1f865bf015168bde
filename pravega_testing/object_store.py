"""An S3-compatible object store for tests and benchmarks: moto's server (PyPI ``moto[server]``) in
this process on a free loopback port, and the Spark settings that reach it through Hadoop's ``s3a``
connector (``hadoop-aws`` at the version of pyspark's Hadoop, fetched by Spark's own Ivy from Maven
Central into the project's cache the first time: about 700 MB with the AWS SDK bundle)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_provider_pravega._cache import cache_dir
from pravega_testing.net import free_port



def hadoop_version() -> str:
    """The Hadoop version of the installed pyspark (from its ``hadoop-client-api`` jar)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    for jar in jars.glob("hadoop-client-api-*.jar"):
        return jar.name[len("hadoop-client-api-"):-len(".jar")]
    raise RuntimeError(f"no hadoop-client-api jar in {jars}")


@dataclass
class ObjectStore:
    endpoint: str
    client: Any  # boto3 S3 client
    access_key: str = "lake-user"
    secret_key: str = "lake-secret"

    def spark_conf(self) -> dict[str, str]:
        """Standard s3a settings only (what a user puts in ``spark_conf`` or the Spark connection)."""
        return {
            "spark.jars.packages": f"org.apache.hadoop:hadoop-aws:{hadoop_version()}",
            "spark.jars.ivy": str(cache_dir("ivy")),
            "spark.hadoop.fs.s3a.endpoint": self.endpoint,
            "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
            "spark.hadoop.fs.s3a.access.key": self.access_key,
            "spark.hadoop.fs.s3a.secret.key": self.secret_key,
        }

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))

    def read(self, bucket: str, key: str) -> bytes:
        return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()


@contextmanager
def object_store_server() -> Iterator[ObjectStore]:
    """moto's S3 server in this process on 127.0.0.1, stopped on exit (needs ``moto[server]``, boto3)."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        store = ObjectStore(endpoint, None)
        store.client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                    aws_access_key_id=store.access_key, aws_secret_access_key=store.secret_key)
        yield store
    finally:
        server.stop()
