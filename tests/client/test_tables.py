"""Table segments through this provider's client, on the embedded server and on Pravega
standalone: batched lookups, conditional updates and removals, paging through every entry."""

from __future__ import annotations

import pytest

from airflow_provider_pravega.client.tables import NOT_EXISTS, UNCONDITIONAL, TableConflictError, TableSegment


def test_lookups_conditional_updates_removal_and_paging(client, unique_name):
    scope = unique_name("tbl")
    client.admin.create_scope(scope)
    table = TableSegment(client, scope, "files")
    keys = [f"k{n:04d}".encode() for n in range(2500)]  # more than one request's batch
    assert table.get([b"nope"]) == [(NOT_EXISTS, None)]

    versions = table.put([(k, b"v-" + k, NOT_EXISTS) for k in keys])
    assert len(versions) == len(keys)
    got = table.get([keys[0], b"nope", keys[-1]])
    assert got == [(versions[0], b"v-" + keys[0]), (NOT_EXISTS, None), (versions[-1], b"v-" + keys[-1])]

    with pytest.raises(TableConflictError):  # must not exist, but does
        table.put([(keys[0], b"again", NOT_EXISTS)])
    with pytest.raises(TableConflictError):  # stale version
        table.put([(keys[1], b"x", versions[1] + 10_000_000)])
    (new,) = table.put([(keys[1], b"changed", versions[1])])
    assert table.get([keys[1]]) == [(new, b"changed")]
    with pytest.raises(TableConflictError):  # removal conditional on the version it had
        table.remove([(keys[1], versions[1])])
    table.remove([(keys[1], new), (keys[2], UNCONDITIONAL)])
    assert table.get([keys[1], keys[2]]) == [(NOT_EXISTS, None), (NOT_EXISTS, None)]

    seen = {k: v for k, _ver, v in table.entries(count=700)}
    assert set(seen) == set(keys) - {keys[1], keys[2]} and seen[keys[3]] == b"v-" + keys[3]
    TableSegment(client, scope, "files").create()  # a second opener: idempotent
