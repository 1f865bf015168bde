"""A ``pravega`` provider for common.messaging's ``MessageQueueTrigger`` (registered in provider.yaml
``queues``), so an ``AssetWatcher`` can watch a stream the Airflow 3 way::

    MessageQueueTrigger(scheme="pravega", scope="iot", stream="readings", after_cut="head")
    MessageQueueTrigger(queue="pravega://controller:9090/iot/readings")   # the older form (deprecated in 2.2)

Either becomes a :class:`~airflow_provider_pravega.triggers.stream.PravegaStreamTrigger` (other
keyword arguments go to it: ``pravega_conn_id``, ``after_cut``, ``poll_interval``,
``sample_events``, ``min_bytes``, ``min_events``, ``max_wait_s`` ...); a queue URI also names the
controller, with credentials and TLS from the connection. Needs
``apache-airflow-providers-common-messaging``.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider

from airflow_provider_pravega.assets import SCHEME, parse_stream_uri
from airflow_provider_pravega.triggers.stream import PravegaStreamTrigger

__all__ = ["PravegaMessageQueueProvider"]


class PravegaMessageQueueProvider(BaseMessageQueueProvider):
    """``scheme="pravega"``, or a ``pravega://host:port/scope/stream`` queue."""

    scheme = SCHEME

    def queue_matches(self, queue: str) -> bool:
        return urllib.parse.urlsplit(queue).scheme.lower() == SCHEME

    def trigger_class(self) -> type[PravegaStreamTrigger]:
        return PravegaStreamTrigger

    def trigger_kwargs(self, queue: str, **kwargs: Any) -> dict[str, Any]:
        host, port, scope, stream = parse_stream_uri(queue)
        shown = f"[{host}]" if ":" in host else host
        return {"controller": f"{shown}:{port}", "scope": scope, "stream": stream}
