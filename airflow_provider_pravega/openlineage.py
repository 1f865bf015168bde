"""OpenLineage datasets for Pravega streams (and the files that ingest/export operators touch).

Operators call :func:`operator_lineage` from ``get_openlineage_facets_on_complete``. OpenLineage is
imported only inside these functions: without the ``apache-airflow-providers-openlineage`` package
they return None and nothing else changes.

Naming follows OpenLineage's conventions: a stream is ``namespace="pravega://host:port"`` (the
controller) and ``name="scope/stream"``; a local file is ``namespace="file"`` with its absolute path
as the name; an object store file is ``namespace="s3://bucket"`` (``gs://``, ``abfss://``,
``hdfs://host:port`` likewise) with the key as the name.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from airflow_provider_pravega.client.config import PravegaConnectionConfig

__all__ = [
    "LIFECYCLE_CHANGES",
    "controller_namespace",
    "file_dataset",
    "operator_lineage",
    "table_dataset",
    "stream_dataset",
    "stream_dataset_name",
    "stream_namespace",
]

log = logging.getLogger(__name__)

#: OpenLineage's dataset lifecycle changes (LifecycleStateChangeDatasetFacet) an operator may report.
LIFECYCLE_CHANGES = ("ALTER", "CREATE", "DROP", "OVERWRITE", "RENAME", "TRUNCATE")


def stream_namespace(config: PravegaConnectionConfig) -> str:
    """``pravega://host:port`` of the controller (IPv6 hosts in brackets)."""
    return controller_namespace(config.host, config.port)


def controller_namespace(host: str, port: int) -> str:
    """``pravega://host:port`` (IPv6 hosts in brackets): also the prefix of ``pravega://`` asset URIs."""
    shown = f"[{host}]" if ":" in host else host
    return f"pravega://{shown}:{port}"


def stream_dataset_name(scope: str, stream: str) -> str:
    return f"{scope}/{stream}"


def _facet_classes() -> Any:
    """The OpenLineage facet module, or None when the OpenLineage provider is not installed."""
    try:
        # optional: the OpenLineage provider (see the module's docstring)
        from airflow.providers.common.compat.openlineage import facet
        from airflow.providers.openlineage.extractors import OperatorLineage  # noqa: F401
    except ImportError:
        return None
    if not isinstance(facet.Dataset, type):  # compat's no-op stand-in: no openlineage client library
        return None
    return facet


def _dataset(namespace: str, name: str, lifecycle: str | None, facets: Mapping[str, Any] | None) -> Any:
    facet = _facet_classes()
    if facet is None:
        return None
    all_facets = dict(facets or {})
    if lifecycle is not None:
        if lifecycle not in LIFECYCLE_CHANGES:
            raise ValueError(f"lifecycle must be one of {', '.join(LIFECYCLE_CHANGES)}, got {lifecycle!r}")
        all_facets["lifecycleStateChange"] = facet.LifecycleStateChangeDatasetFacet(
            lifecycleStateChange=facet.LifecycleStateChange[lifecycle]
        )
    return facet.Dataset(namespace=namespace, name=name, facets=all_facets)


def stream_dataset(
    config: PravegaConnectionConfig,
    scope: str,
    stream: str,
    *,
    lifecycle: str | None = None,
    facets: Mapping[str, Any] | None = None,
) -> Any:
    """An OpenLineage ``Dataset`` for ``scope/stream`` on ``config``'s controller (None without OpenLineage).

    ``lifecycle`` ("CREATE", "TRUNCATE", "DROP", ...) adds a LifecycleStateChangeDatasetFacet.
    """
    return _dataset(stream_namespace(config), stream_dataset_name(scope, stream), lifecycle, facets)


def file_dataset(path: str, *, lifecycle: str | None = None, facets: Mapping[str, Any] | None = None) -> Any:
    """An OpenLineage ``Dataset`` for a file path or URL (None without OpenLineage)."""
    namespace, name = _file_identity(path)
    return _dataset(namespace, name, lifecycle, facets)


def table_dataset(location: str, *, storage_layer: str = "delta", version: int | None = None) -> Any:
    """An OpenLineage ``Dataset`` for a path-based table (a Delta table at ``location``): named like
    its location (OpenLineage's naming for path tables), with the storage facet saying what it is
    and, once written, the table version (None without OpenLineage)."""
    if _facet_classes() is None:
        return None
    # optional: the openlineage client (see the module's docstring)
    from openlineage.client.facet_v2 import dataset_version_dataset, storage_dataset

    facets: dict[str, Any] = {"storage": storage_dataset.StorageDatasetFacet(storageLayer=storage_layer,
                                                                             fileFormat="parquet")}
    if version is not None:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=str(version))
    return file_dataset(location, facets=facets)


CATALOG_SCHEME = "spark-catalog"
DEFAULT_CATALOG = "spark_catalog"


def catalog_table_identity(name: str) -> tuple[str, str]:
    """``("spark-catalog://<catalog>", "<db>.<table>")`` for the catalog table ``name``
    (``db.table`` or ``catalog.db.table``; ``spark_catalog``, Spark's session catalog, when it
    names none; back quotes dropped): its lineage namespace and name, and its asset URI's parts."""
    parts = [p.strip("`") for p in _split_name(name)]
    if len(parts) not in (2, 3) or not all(parts):
        raise ValueError(f"{name!r}: a catalog table is named 'db.table' or 'catalog.db.table'")
    catalog = parts[0] if len(parts) == 3 else DEFAULT_CATALOG
    return f"{CATALOG_SCHEME}://{catalog}", ".".join(parts[-2:])


def _split_name(name: str) -> list[str]:
    """``a.`b.c`.d`` -> ["a", "`b.c`", "d"]: dots inside back quotes do not split."""
    parts, current, quoted = [], "", False
    for ch in name.strip():
        if ch == "`":
            quoted = not quoted
        if ch == "." and not quoted:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [*parts, current]


def catalog_table_dataset(name: str, *, storage_layer: str = "delta", version: int | None = None) -> Any:
    """An OpenLineage ``Dataset`` for a catalog table whose catalog reports no location: namespace
    ``spark-catalog://<catalog>``, name ``<db>.<table>`` (the parts of its asset URI,
    :func:`catalog_table_identity`), with the storage and version facets (None without OpenLineage)."""
    if _facet_classes() is None:
        return None
    # optional: the openlineage client (see the module's docstring)
    from openlineage.client.facet_v2 import dataset_version_dataset, storage_dataset

    namespace, table = catalog_table_identity(name)
    facets: dict[str, Any] = {"storage": storage_dataset.StorageDatasetFacet(storageLayer=storage_layer,
                                                                             fileFormat="parquet")}
    if version is not None:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=str(version))
    return _dataset(namespace, table, None, facets)


def _file_identity(path: str) -> tuple[str, str]:
    parts = urlsplit(path)
    if parts.scheme in ("", "file") or len(parts.scheme) == 1:  # one letter: a Windows drive
        local = parts.path if parts.scheme == "file" else path
        return "file", os.path.abspath(local)
    if not parts.netloc:
        raise ValueError(f"cannot name the dataset of {path!r}: a {parts.scheme}:// URL needs a bucket or host")
    return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/") or "/"


def operator_lineage(
    *,
    inputs: Iterable[Any] = (),
    outputs: Iterable[Any] = (),
    run_facets: Mapping[str, Any] | None = None,
    job_facets: Mapping[str, Any] | None = None,
) -> Any:
    """An ``OperatorLineage`` of the given datasets (None entries dropped), or None without OpenLineage."""
    if _facet_classes() is None:
        return None
    # optional: the OpenLineage provider (see the module's docstring)
    from airflow.providers.openlineage.extractors import OperatorLineage

    return OperatorLineage(
        inputs=[d for d in inputs if d is not None],
        outputs=[d for d in outputs if d is not None],
        run_facets=dict(run_facets or {}),
        job_facets=dict(job_facets or {}),
    )
