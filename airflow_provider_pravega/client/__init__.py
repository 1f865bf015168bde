"""Pravega semantics usable without Airflow: admin, cross-process transactions, and the
connection layer they share.

``PravegaClient`` is the one object the hook, operators and Spark tasks build from a
:class:`~airflow_provider_pravega.client.config.PravegaConnectionConfig` (or a controller URI).
Submodules are imported lazily so that ``client.config`` (used by the hook at DAG-parse time)
does not pull in gRPC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from airflow_provider_pravega.client.admin import StreamAdmin
    from airflow_provider_pravega.client.config import PravegaConnectionConfig
    from airflow_provider_pravega.client.connection import ConnectionPool
    from airflow_provider_pravega.client.segment_client import SegmentStoreClient
    from airflow_provider_pravega.client.controller import ControllerClient
    from airflow_provider_pravega.client.transactions import (
        LeaseKeeper,
        TransactionManager,
    )
    from airflow_provider_pravega.client.writer import EventWriter

__all__ = ["PravegaClient"]


class PravegaClient:
    """Controller client, segment-store connections, admin, transactions and event writers over
    one configuration: the provider's own client (no official ``pravega`` package needed).

    ``PravegaClient("tcp://127.0.0.1:9090")`` or ``PravegaClient(config)``; use as a context
    manager or call :meth:`close`. Nothing connects until the first call; an unreachable
    controller raises ControllerUnreachableError (naming the URI) within seconds.
    """

    def __init__(
        self, config_or_uri: PravegaConnectionConfig | str, *, timeout_s: float = 10.0
    ) -> None:
        # import cost: this package runs before each of its modules; client.config (DAG parse) must not pull in gRPC
        from airflow_provider_pravega.client.admin import StreamAdmin
        from airflow_provider_pravega.client.config import PravegaConnectionConfig
        from airflow_provider_pravega.client.connection import ConnectionPool
        from airflow_provider_pravega.client.segment_client import SegmentStoreClient
        from airflow_provider_pravega.client.controller import ControllerClient
        from airflow_provider_pravega.client.transactions import TransactionManager

        if not isinstance(config_or_uri, (str, PravegaConnectionConfig)):
            raise TypeError(
                f"PravegaClient needs a controller URI or a PravegaConnectionConfig, got {type(config_or_uri).__name__}"
            )
        if isinstance(config_or_uri, str) and config_or_uri.strip().lower().startswith("tls://"):
            # A TLS URI alone: trust the system CAs (a config can name a trust store and credentials).
            config_or_uri = PravegaConnectionConfig.from_connection_fields(host=config_or_uri.strip())
        self.config: PravegaConnectionConfig | None = (
            config_or_uri
            if isinstance(config_or_uri, PravegaConnectionConfig)
            else None
        )
        self.controller: ControllerClient = ControllerClient(
            config_or_uri, timeout_s=timeout_s
        )
        # Segment-store connections: TLS as the config says; tokens from this client's controller.
        self.pool: ConnectionPool = ConnectionPool(config=self.config)
        self.segments: SegmentStoreClient = SegmentStoreClient(
            self.controller, self.pool
        )
        self.admin: StreamAdmin = StreamAdmin(self.controller, self.segments)
        self.transactions: TransactionManager = TransactionManager(
            self.controller, self.segments
        )

    @property
    def controller_uri(self) -> str:
        return self.controller.uri

    @property
    def connection_config(self) -> PravegaConnectionConfig:
        """The configuration another process (a Spark task) rebuilds this client from: the one it
        was made with, or its controller URI's."""
        if self.config is not None:
            return self.config
        # import cost: lazy, see __init__
        from airflow_provider_pravega.client.config import PravegaConnectionConfig

        return PravegaConnectionConfig.from_connection_fields(host=self.controller_uri)

    def lease_keeper(
        self, interval_s: float | None = None, **options: Any
    ) -> LeaseKeeper:
        """A started LeaseKeeper using this client's transaction manager."""
        # import cost: lazy, see __init__
        from airflow_provider_pravega.client.transactions import LeaseKeeper

        return LeaseKeeper(self.transactions, interval_s, **options)

    def event_writer(self, scope: str, stream: str, **options: Any) -> EventWriter:
        """A pipelined writer of plain (non-transactional) events to ``scope/stream``, routed by
        routing key like the official client's, surviving scaling; ``max_inflight_events``
        (default 1,000) bounds what each segment has in flight. ``flush`` waits for every ack."""
        # import cost: lazy, see __init__
        from airflow_provider_pravega.client.writer import EventWriter

        return EventWriter(self.segments, scope, stream, **options)

    def close(self) -> None:
        self.pool.close()
        self.controller.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PravegaClient({self.controller.uri!r})"
