"""A well-behaved OFFICIAL-client session for test_garbage_connection.py, run as its own process.

    python tests/fuzz/good_client.py CONTROLLER_URI SCOPE DURATION_S

Credentials, when the server wants them, come from the official client's own environment
variables (``pravega_client_auth_method`` etc.).

The official client holds the GIL while it waits for the network, so it cannot share a process
with the thread that floods the server with garbage. Until DURATION_S has passed it writes rounds
of uniquely numbered events (two segments, several routing keys) and reads each round back with
one reader group before writing the next. Prints one JSON line with what it saw; exits 1 if any
event is missing or duplicated, or if the client raised.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import traceback
from collections import Counter

import pravega_client

ROUND = 40  # events per round
READ_TIMEOUT_S = 30.0


async def session(uri: str, scope: str, duration_s: float) -> dict:
    # With the official client's credential variables set (a server with --auth-file), use them.
    manager = pravega_client.StreamManager(uri, auth_enabled=bool(os.environ.get("pravega_client_auth_method")))
    manager.create_scope(scope)
    manager.create_stream(scope, "good", 2)
    writer = manager.create_writer(scope, "good", 100)
    group = manager.create_reader_group("good-rg", scope, "good")
    reader = group.create_reader("r0")
    seen: Counter[bytes] = Counter()
    written = 0
    rounds = 0
    deadline = time.monotonic() + duration_s
    try:
        while time.monotonic() < deadline or rounds == 0:
            for _ in range(ROUND):
                writer.write_event(f"event-{written:06d}", f"key-{written % 7}")
                written += 1
            writer.flush()
            rounds += 1
            read_by = time.monotonic() + READ_TIMEOUT_S
            while sum(seen.values()) < written:
                if time.monotonic() > read_by:
                    raise TimeoutError(f"round {rounds}: read {sum(seen.values())} of {written} events "
                                       f"within {READ_TIMEOUT_S} s")
                try:
                    piece = await asyncio.wait_for(reader.get_segment_slice_async(), 5)
                except asyncio.TimeoutError:
                    continue
                for event in piece:
                    seen[event.data()] += 1
                reader.release_segment(piece)
    finally:
        reader.reader_offline()
    expected = {f"event-{i:06d}".encode() for i in range(written)}
    return {
        "written": written,
        "rounds": rounds,
        "read": sum(seen.values()),
        "missing": sorted(e.decode() for e in expected - set(seen))[:20],
        "duplicated": sorted(e.decode() for e, n in seen.items() if n > 1)[:20],
        "unexpected": sorted(e.decode(errors="replace") for e in set(seen) - expected)[:20],
    }


def main() -> int:
    uri, scope, duration = sys.argv[1], sys.argv[2], float(sys.argv[3])
    try:
        result = asyncio.run(session(uri, scope, duration))
    except Exception as exc:  # reported to the test as data, with the traceback
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}))
        return 1
    print(json.dumps(result))
    ok = not (result["missing"] or result["duplicated"] or result["unexpected"]) and result["read"] == result["written"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
