"""What the Pravega sensors share: the connection and scope, and "poke once, then defer"."""

from __future__ import annotations

from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout, AirflowSkipException

from airflow_provider_pravega._streams import resolve_scope
from airflow_provider_pravega.hooks.pravega import PravegaHook

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.triggers.base import BaseTrigger


class PravegaSensorBase(BaseSensorOperator):
    """A sensor on one stream: ``stream``, ``scope`` (default: the connection's), ``pravega_conn_id``
    and ``deferrable`` (default ``[operators] default_deferrable``).

    Deferrable mode pokes once first (no need to defer when the wait is already over) and then
    defers to :meth:`deferred_trigger`, resuming in ``execute_complete``.
    """

    ui_color = "#d6ecfa"

    def __init__(
        self,
        *,
        stream: str,
        scope: str | None = None,
        pravega_conn_id: str = PravegaHook.default_conn_name,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.scope = scope
        self.pravega_conn_id = pravega_conn_id
        self.deferrable = deferrable

    @cached_property
    def hook(self) -> PravegaHook:
        return PravegaHook(pravega_conn_id=self.pravega_conn_id)

    def _scope(self) -> str:
        return resolve_scope(self.scope, self.hook.get_config(), self.pravega_conn_id)

    def deferred_trigger(self) -> BaseTrigger:
        """The trigger that waits for the rest, after a first poke that was not done."""
        raise NotImplementedError

    def _first_poke(self, context: Context) -> bool | PokeReturnValue:
        """The check made before deferring, failing (or skipping, with soft_fail) as a poke would."""
        try:
            return self.poke(context)
        except (AirflowFailException, AirflowSensorTimeout) as exc:
            if self.soft_fail or self.never_fail:
                raise AirflowSkipException(f"Skipping ({'soft_fail' if self.soft_fail else 'never_fail'}): {exc}") from exc
            raise

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        done = self._first_poke(context)
        if done:
            return done.xcom_value if isinstance(done, PokeReturnValue) else None
        self.defer(trigger=self.deferred_trigger(), method_name="execute_complete", timeout=timedelta(seconds=self.timeout))
