"""The ``pravega`` asset URI scheme: ``pravega://host:port/scope/stream``.

Registered in provider.yaml (``asset-uris``), so Airflow normalizes every ``Asset("pravega://…")``
through :func:`sanitize_uri` (the controller port defaults to 9090; scope and stream must be valid
Pravega names), builds assets with :func:`create_asset` and maps them to OpenLineage datasets with
:func:`convert_asset_to_openlineage` (the same namespace and name the operators report).
"""

from __future__ import annotations

import os
import urllib.parse
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset

from airflow_provider_pravega.openlineage import catalog_table_identity, controller_namespace, stream_dataset_name
from airflow_provider_pravega.protocol.naming import validate_scope_name, validate_stream_name

if TYPE_CHECKING:
    from urllib.parse import SplitResult

__all__ = ["DEFAULT_PORT", "SCHEME", "convert_asset_to_openlineage", "create_asset", "parse_stream_uri", "sanitize_uri",
           "stream_uri", "catalog_table_asset", "catalog_table_uri", "table_asset", "table_uri"]

SCHEME = "pravega"
#: Pravega's controller port, assumed when an asset URI names none.
DEFAULT_PORT = 9090


def stream_uri(host: str, port: int | None, scope: str, stream: str) -> str:
    """``pravega://host:port/scope/stream`` (IPv6 hosts in brackets), names checked."""
    validate_scope_name(scope)
    validate_stream_name(stream)
    return f"{controller_namespace(host, port or DEFAULT_PORT)}/{stream_dataset_name(scope, stream)}"


def _parts(uri: SplitResult) -> tuple[str, int, str, str]:
    """(host, port, scope, stream) of a ``pravega://`` URI; a bad one raises ValueError saying why."""
    text = urllib.parse.urlunsplit(uri)
    if not uri.hostname:
        raise ValueError(f"{text}: a pravega asset URI names its controller: pravega://host:port/scope/stream")
    try:
        port = uri.port or DEFAULT_PORT
    except ValueError:
        raise ValueError(f"{text}: the controller port is not a number") from None
    path = [part for part in uri.path.split("/") if part]
    if len(path) != 2:
        raise ValueError(f"{text}: the path must be /scope/stream, got {uri.path or '/'!r}")
    scope, stream = (urllib.parse.unquote(part) for part in path)
    try:
        validate_scope_name(scope)
        validate_stream_name(stream)
    except ValueError as exc:
        raise ValueError(f"{text}: {exc}") from None
    return uri.hostname, port, scope, stream


def parse_stream_uri(uri: str) -> tuple[str, int, str, str]:
    """(host, port, scope, stream) of ``pravega://host[:port]/scope/stream`` (port 9090 by default)."""
    return _parts(urllib.parse.urlsplit(uri))


def sanitize_uri(uri: SplitResult) -> SplitResult:
    """Airflow's normalizer for ``pravega://``: default port, host in lower case, scope and stream
    validated (a bad one is an error naming it)."""
    host, port, scope, stream = _parts(uri)
    return urllib.parse.urlsplit(stream_uri(host, port, scope, stream))


def create_asset(*, scope: str, stream: str, host: str = "localhost", port: int = DEFAULT_PORT,
                 extra: dict[str, Any] | None = None) -> Any:
    """An ``Asset`` for a stream (Airflow's asset factory for the ``pravega`` scheme)."""
    return Asset(uri=stream_uri(host, port, scope, stream), extra=extra)


def convert_asset_to_openlineage(asset: Any, lineage_context: Any) -> Any:
    """The OpenLineage dataset of a ``pravega://`` asset: namespace ``pravega://host:port``, name
    ``scope/stream`` (what the operators report for the same stream)."""
    # optional: only OpenLineage calls this; its facets come with the OpenLineage provider
    from airflow.providers.common.compat.openlineage.facet import Dataset

    host, port, scope, stream = _parts(urllib.parse.urlsplit(asset.uri))
    return Dataset(namespace=controller_namespace(host, port), name=stream_dataset_name(scope, stream))


def table_uri(location: str) -> str:
    """The asset URI of a table at ``location``: a local path as ``file:///abs/path``, a URL as
    given (``s3a://``, ``hdfs://`` …), without a trailing slash."""
    parts = urllib.parse.urlsplit(location)
    if parts.scheme in ("", "file"):
        local = os.path.abspath(parts.path if parts.scheme == "file" else location)
        return "file://" + urllib.parse.quote(local)
    if not parts.netloc:
        raise ValueError(f"{location!r}: a {parts.scheme}:// table location needs a bucket or host")
    return location.rstrip("/")


def table_asset(location: str, *, format: str = "delta") -> Any:
    """The ``Asset`` of the table at ``location``: what the export operator with ``format="delta"``
    updates (an outlet), so downstream DAGs can be scheduled on the table with the same call."""
    return Asset(uri=table_uri(location), extra={"format": format})


#: The scheme of a catalog table's name-based asset URI (``table=`` exports).
def catalog_table_uri(name: str) -> str:
    """The name-based asset URI of the catalog table ``name`` (``db.table`` or
    ``catalog.db.table``): ``spark-catalog://<catalog>/<db>.<table>``, the catalog
    ``spark_catalog`` (Spark's session catalog) when the name has none; back quotes dropped
    (the naming is the lineage dataset's, openlineage.catalog_table_identity)."""
    namespace, table = catalog_table_identity(name)
    return f"{namespace}/" + urllib.parse.quote(table, safe=".")


def catalog_table_asset(name: str, *, format: str = "delta") -> Any:
    """The ``Asset`` of the catalog table ``name``: what the export operator with ``table=`` updates
    (an outlet; the table's location is not known when the DAG is parsed, so it is named by its
    name, :func:`catalog_table_uri`)."""
    return Asset(uri=catalog_table_uri(name), extra={"format": format, "table": name})
