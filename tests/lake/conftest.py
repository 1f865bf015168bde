"""An S3-compatible object store for the lake tests (see pravega_testing.object_store)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pravega_testing.object_store import ObjectStore, object_store_server


@pytest.fixture(scope="module")
def object_store() -> Iterator[ObjectStore]:
    pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    with object_store_server() as store:
        yield store
