"""A trigger that waits, in the triggerer, until Pravega transactions are committed.

Each poll asks the controller once per still-pending transaction (checkTransactionState). The
blocking gRPC call runs in a worker thread (``asyncio.to_thread``) so the triggerer's event loop
never waits on the network; the connection is read with Airflow's async connection API.
"""

from __future__ import annotations

import ast
import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_pravega.client.controller_types import TransactionInfo, TxnStatus, parse_txn_id
from airflow_provider_pravega.client.errors import ControllerUnreachableError, PravegaError

__all__ = ["FAILED_STATES", "PravegaTransactionTrigger", "format_txn_id", "parse_txn_ids"]

#: States from which a transaction can never become COMMITTED (UNKNOWN: never existed or forgotten).
FAILED_STATES = frozenset({TxnStatus.ABORTING, TxnStatus.ABORTED, TxnStatus.UNKNOWN})


def format_txn_id(txn_id: int) -> str:
    """The 32-hex-digit form used in logs, XCom and trigger arguments."""
    return f"{txn_id:032x}"


def _parse_one(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"a transaction id is a number or text, not {value!r}")
    if isinstance(value, Mapping):  # TransactionInfo.to_dict()
        if "txn_id" not in value:
            raise ValueError(f"a transaction given as a mapping needs a 'txn_id' key, got keys {sorted(value)}")
        return parse_txn_id(value["txn_id"])
    if isinstance(value, TransactionInfo):
        return value.txn_id
    if isinstance(value, uuid.UUID):
        return value.int
    if isinstance(value, int):
        return parse_txn_id(value)
    if not isinstance(value, str):
        raise TypeError(f"a transaction id is an int or a string, got {type(value).__name__}")
    text = value.strip()
    try:
        if "-" in text:  # how Pravega itself prints transaction ids
            return uuid.UUID(text).int
        if len(text) == 32 or text[:2].lower() == "0x":  # what this package prints (may be all digits)
            return parse_txn_id(text)
        if text.isdigit():  # an int XCom rendered by a template
            return parse_txn_id(int(text))
    except ValueError:
        pass
    raise ValueError(f"transaction id {value!r} is not 32 hex digits, 0x-hex, a UUID or a decimal number")


def parse_txn_ids(value: Any) -> list[int]:
    """One or many transaction ids -> ints, in order, without repeats.

    Accepts an int, a string (32 hex digits as this package prints them, ``0x``-hex, Pravega's
    UUID form, or decimal), a ``TransactionInfo`` or its dict, a list of these, or a list rendered
    to text by a template (JSON or Python literal). A string of exactly 32 characters is always hex
    (ids like ``000...05`` are all digits); decimal text (an int XCom rendered by a template) is
    read as such at any other length.
    """
    if isinstance(value, str):
        text = value.strip()
        if text.startswith(("[", "(")):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                try:
                    value = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    raise ValueError(f"transaction_ids {text!r} looks like a list but cannot be parsed") from None
        elif "," in text:
            value = [part for part in text.split(",") if part.strip()]
    items: Iterable[Any] = value if isinstance(value, (list, tuple, set, frozenset)) else [value]
    ids: list[int] = []
    for item in items:
        txn_id = _parse_one(item)
        if txn_id not in ids:
            ids.append(txn_id)
    if not ids:
        raise ValueError("transaction_ids is empty: give at least one transaction id")
    return ids


class PravegaTransactionTrigger(BaseTrigger):
    """Fires once every transaction is COMMITTED, or as soon as one can never be.

    :param scope: The stream's scope.
    :param stream: The stream the transactions belong to.
    :param transaction_ids: Transaction ids (see :func:`parse_txn_ids`); kept as 32-hex-digit text.
    :param pravega_conn_id: The ``pravega`` connection.
    :param poll_interval: Seconds between polls.
    :param end_time: Epoch seconds after which the trigger gives up with a ``timeout`` event (the
        deferring sensor's timeout; the triggerer enforces it too, this makes it hold everywhere).

    Events: ``{"status": "success", "committed": [ids]}``; ``{"status": "error", "txn_id", "state",
    "message"}`` for ABORTING/ABORTED/UNKNOWN or a missing stream; ``{"status": "timeout",
    "pending": {id: state}, "message"}``.
    """

    def __init__(
        self,
        *,
        scope: str,
        stream: str,
        transaction_ids: Any,
        pravega_conn_id: str = "pravega_default",
        poll_interval: float = 5.0,
        end_time: float | None = None,
    ) -> None:
        super().__init__()
        self.scope = scope
        self.stream = stream
        self.transaction_ids = [format_txn_id(t) for t in parse_txn_ids(transaction_ids)]
        self.pravega_conn_id = pravega_conn_id
        self.poll_interval = float(poll_interval)
        self.end_time = None if end_time is None else float(end_time)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "scope": self.scope,
                "stream": self.stream,
                "transaction_ids": list(self.transaction_ids),
                "pravega_conn_id": self.pravega_conn_id,
                "poll_interval": self.poll_interval,
                "end_time": self.end_time,
            },
        )

    async def _controller(self) -> Any:
        # import cost: the controller client and the hook bring gRPC; the sensor's DAG files import this trigger
        from airflow_provider_pravega.client.controller import ControllerClient
        from airflow_provider_pravega.hooks.pravega import PravegaHook

        conn = await PravegaHook.aget_connection(self.pravega_conn_id)
        return ControllerClient(PravegaHook.config_from_connection(conn))

    def _error(self, txn_id: str, state: TxnStatus, detail: str) -> TriggerEvent:
        return TriggerEvent(
            {
                "status": "error",
                "scope": self.scope,
                "stream": self.stream,
                "txn_id": txn_id,
                "state": state.value,
                "message": f"Pravega transaction {txn_id} on {self.scope}/{self.stream} is {state.value}: {detail}",
            }
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        controller = await self._controller()
        pending: dict[str, TxnStatus] = {t: TxnStatus.OPEN for t in self.transaction_ids}
        try:
            while True:
                for txn_id in list(pending):
                    try:
                        state = await asyncio.to_thread(
                            controller.check_transaction_state, self.scope, self.stream, int(txn_id, 16)
                        )
                    except ControllerUnreachableError as exc:
                        self.log.warning("Cannot check transaction %s yet (will retry): %s", txn_id, exc)
                        break
                    except PravegaError as exc:  # the stream or scope is gone, credentials refused, ...
                        yield self._error(txn_id, TxnStatus.UNKNOWN, str(exc))
                        return
                    if state == TxnStatus.COMMITTED:
                        del pending[txn_id]
                        self.log.info("Transaction %s on %s/%s is COMMITTED", txn_id, self.scope, self.stream)
                    elif state in FAILED_STATES:
                        yield self._error(txn_id, state, _FAILED_DETAIL[state])
                        return
                    else:
                        pending[txn_id] = state
                if not pending:
                    yield TriggerEvent(
                        {"status": "success", "scope": self.scope, "stream": self.stream,
                         "committed": list(self.transaction_ids)}
                    )
                    return
                if self.end_time is not None and time.time() >= self.end_time:
                    states = {t: s.value for t, s in pending.items()}
                    yield TriggerEvent(
                        {
                            "status": "timeout",
                            "scope": self.scope,
                            "stream": self.stream,
                            "pending": states,
                            "message": f"Pravega transactions on {self.scope}/{self.stream} not committed in time: "
                            + ", ".join(f"{t} is {s}" for t, s in states.items()),
                        }
                    )
                    return
                self.log.debug("Waiting for transactions %s", {t: s.value for t, s in pending.items()})
                delay = self.poll_interval
                if self.end_time is not None:
                    delay = max(0.0, min(delay, self.end_time - time.time()))
                await asyncio.sleep(delay)
        finally:
            await asyncio.to_thread(controller.close)


_FAILED_DETAIL = {
    TxnStatus.ABORTING: "it is being aborted and will never be committed",
    TxnStatus.ABORTED: "it was aborted (explicitly or because its lease expired); its events are discarded",
    TxnStatus.UNKNOWN: "the controller does not know it (wrong id or stream, or long finished)",
}
