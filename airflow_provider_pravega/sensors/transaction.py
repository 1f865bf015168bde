"""A sensor that waits until Pravega transactions are committed, and fails loudly when they never will be."""

from __future__ import annotations

import ast
import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout

from airflow_provider_pravega.client.controller_types import TxnStatus
from airflow_provider_pravega.client.ingest_location import open_state_store
from airflow_provider_pravega.client.ingest_state import REQUESTED
from airflow_provider_pravega.client.streamcut import StreamCut
from airflow_provider_pravega.sensors._base import PravegaSensorBase
from airflow_provider_pravega.triggers.transaction import (
    _FAILED_DETAIL,
    FAILED_STATES,
    PravegaTransactionTrigger,
    format_txn_id,
    parse_txn_ids,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["PravegaTransactionFailedError", "PravegaTransactionSensor"]


class PravegaTransactionFailedError(AirflowFailException):
    """A transaction is ABORTING, ABORTED or UNKNOWN: it will never commit, so retrying cannot help."""


class PravegaTransactionSensor(PravegaSensorBase):
    """Wait until every given transaction of a stream is COMMITTED.

    Fails at once, naming the transaction and its state, when one is ABORTING, ABORTED or UNKNOWN
    (no retries: such a transaction can never commit). Times out after ``timeout`` seconds.

    :param stream: The stream the transactions belong to.
    :param transaction_ids: One id or a list (templated; e.g. the ingest operator's XCom with
        ``wait_for_commit=False``): ints, 32-hex-digit or decimal text, UUID text, or
        ``TransactionInfo`` dicts.
    :param scope: The stream's scope (default: the connection's default scope).
    :param ingest_run: The ingest operator's XCom (templated, e.g.
        ``"{{ ti.xcom_pull(task_ids='ingest') }}"``) when waiting for an ingest with
        ``wait_for_commit=False``: once every transaction is COMMITTED the sensor records the run
        done in the ingest's state, and a transaction the controller already forgot (UNKNOWN) counts
        as committed when the ingest recorded its commit request acknowledged.
    :param pravega_conn_id: The ``pravega`` connection.
    :param deferrable: Wait in the triggerer (no worker slot) through
        :class:`~airflow_provider_pravega.triggers.transaction.PravegaTransactionTrigger`.
        Default: ``[operators] default_deferrable``.

    ``poke_interval``, ``timeout``, ``mode`` ("poke"/"reschedule") and ``soft_fail`` are the usual
    sensor arguments. XCom: the committed transaction ids (32 hex digits each).
    """

    template_fields: Sequence[str] = ("scope", "stream", "transaction_ids", "ingest_run")

    def __init__(self, *, stream: str, transaction_ids: Any, ingest_run: Any = None, **kwargs: Any) -> None:
        super().__init__(stream=stream, **kwargs)
        self.transaction_ids = transaction_ids
        self.ingest_run = ingest_run
        self._committed: set[int] = set()

    def _ids(self) -> list[int]:
        value = self.transaction_ids
        if value is None or isinstance(value, str) and value.strip() in ("", "None"):
            # What a template renders when the XCom it pulls is missing: not "nothing to wait for".
            raise AirflowFailException(
                f"{self.task_id}: transaction_ids is {value!r}, not transaction ids: a template renders so when the "
                f"XCom it pulls is missing (check the task and key it pulls); give [] when there is nothing to wait "
                f"for")
        if (isinstance(value, (list, tuple, set)) and not value) or (
            isinstance(value, str) and value.strip() in ("[]", "()")
        ):
            # Nothing to wait for: e.g. an ingest interval whose files were all ingested already.
            return []
        try:
            return parse_txn_ids(value)
        except (TypeError, ValueError) as exc:
            raise AirflowFailException(f"{self.task_id}: bad transaction_ids: {exc}") from None

    def poke(self, context: Context) -> bool | PokeReturnValue:
        # import cost: the full controller client (gRPC stubs, 10 more modules) only when poked; DAG files import the sensor
        from airflow_provider_pravega.client.controller import ControllerClient

        scope, ids = self._scope(), self._ids()
        pending: dict[str, str] = {}
        with ControllerClient(self.hook.get_config()) as controller:
            for txn_id in ids:
                if txn_id in self._committed:
                    continue
                state = controller.check_transaction_state(scope, self.stream, txn_id)
                if state == TxnStatus.COMMITTED:
                    self._committed.add(txn_id)
                elif state == TxnStatus.UNKNOWN and self._acknowledged():
                    self._committed.add(txn_id)  # committed, then forgotten by the controller
                elif state in FAILED_STATES:
                    raise PravegaTransactionFailedError(
                        f"Pravega transaction {format_txn_id(txn_id)} on {scope}/{self.stream} is {state.value}: "
                        f"{_FAILED_DETAIL[state]}"
                    )
                else:
                    pending[format_txn_id(txn_id)] = state.value
        if pending:
            self.log.info("Waiting for transactions on %s/%s: %s", scope, self.stream, pending)
            return False
        committed = [format_txn_id(t) for t in ids]
        self.log.info("All %d transactions on %s/%s are COMMITTED", len(committed), scope, self.stream)
        self._record_ingest_done()
        return PokeReturnValue(is_done=True, xcom_value=committed)

    def _ingest(self) -> tuple[str, str, str] | None:
        """(state scope, state stream, run id) of the ingest run given by ``ingest_run``."""
        value = self.ingest_run
        if isinstance(value, str):
            text = value.strip()
            if text in ("", "None"):
                return None
            try:
                value = json.loads(text)
            except ValueError:
                try:
                    value = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    raise AirflowFailException(f"{self.task_id}: ingest_run is not the ingest's XCom: {text[:200]!r}")
        if not value:
            return None
        if isinstance(value, dict) and "run_id" in value and not value["run_id"]:
            return None  # the ingest had nothing to do (no state location either: nothing was recorded)
        if not isinstance(value, dict) or not all(value.get(k) for k in ("state_scope", "state_stream")):
            raise AirflowFailException(f"{self.task_id}: ingest_run must be the ingest operator's XCom (a dict with "
                                       f"run_id, state_scope and state_stream), got {str(value)[:200]!r}")
        if not value.get("run_id"):
            return None  # the ingest had nothing to do
        return value["state_scope"], value["state_stream"], value["run_id"]

    def _acknowledged(self) -> bool:
        """True when the ingest recorded its commit requests acknowledged (or the run done)."""
        ingest = self._ingest()
        if ingest is None:
            return False
        state_scope, state_stream, run_id = ingest
        with self.hook.get_client() as client, open_state_store(client, state_scope, state_stream, create=False) as store:
            run = store.fetch()["runs"].get(run_id)
        return run is None or run["phase"] == REQUESTED

    def _record_ingest_done(self) -> None:
        ingest = self._ingest()
        if ingest is None:
            return
        # import cost: client.ingest brings the transaction manager and the controller client (see poke)
        from airflow_provider_pravega.client.ingest import record_run_done
        state_scope, state_stream, run_id = ingest
        with self.hook.get_client() as client, open_state_store(client, state_scope, state_stream, create=False) as store:
            # Every transaction is COMMITTED: the tail now ends the run's interval piece (no other run
            # of the ingest with an interval commits before this run is recorded done).
            end = StreamCut.tail(client, self._scope(), self.stream).positions
            if record_run_done(store, run_id, end=end):
                self.log.info("Recorded ingest run %s done in %s/%s", run_id, state_scope, state_stream)

    def deferred_trigger(self) -> PravegaTransactionTrigger:
        return PravegaTransactionTrigger(
            scope=self._scope(),
            stream=self.stream,
            transaction_ids=[format_txn_id(t) for t in self._ids() if t not in self._committed],
            pravega_conn_id=self.pravega_conn_id,
            poll_interval=self.poke_interval,
            end_time=time.time() + self.timeout,
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> list[str]:
        """Resume after the trigger: return the committed ids, or raise what went wrong."""
        if not event:
            raise AirflowFailException(f"{self.task_id}: the transaction trigger ended without an event")
        status = event.get("status")
        if status == "success" or (status == "error" and event.get("state") == "UNKNOWN" and self._acknowledged()):
            if status != "success":  # one was forgotten after its acknowledged commit: check the rest
                done = self.poke(context)
                if not done:
                    raise AirflowFailException(f"{self.task_id}: transactions still pending after the trigger ended")
            committed = [format_txn_id(t) for t in self._ids()]
            self.log.info("All %d transactions are COMMITTED", len(committed))
            self._record_ingest_done()
            return committed
        if status == "timeout":
            raise AirflowSensorTimeout(f"{self.task_id}: {event.get('message')}")
        raise PravegaTransactionFailedError(str(event.get("message") or event))
