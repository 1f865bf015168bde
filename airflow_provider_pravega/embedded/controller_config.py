"""Tunables of the embedded controller, checked when they are made."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Tunables of the embedded controller.

    ``lease_cap_ms``: when set, the lease of createTransaction/pingTransaction is
    ``min(requested, lease_cap_ms)`` and no request is refused as too large or too small — how
    tests get short leases although the official client always asks for 90 s. Without it, leases
    outside ``min_lease_ms``..``max_lease_ms`` are refused, as Pravega's controller does (its
    ``minLeaseValue`` is 10 s by default).
    """

    max_lease_ms: int = 120_000
    min_lease_ms: int = 10_000
    lease_cap_ms: int | None = None
    lease_check_interval_s: float = 0.25
    max_execution_time_ms: int = 24 * 3600 * 1000
    snapshot_every: int = 1000
    list_page_size: int = 1000
    finished_txn_limit: int = 10_000
    finished_txn_retention_ms: int = 24 * 3600 * 1000
    # With authentication: grant delegation tokens exactly as Pravega 0.13 does (the official client
    # then needs READ_UPDATE for any token, so read-only users are refused) instead of granting the
    # caller's own permission.
    pravega_token_rules: bool = False
    # The retention service (Pravega's retention.frequency.minutes, default 30): how often it runs
    # over the streams with a retention policy, and how far apart the stream cuts it records are.
    retention_interval_s: float = 1800.0
    # Auto-scaling: how long a scale-down request's cold marker stays valid (Pravega's
    # REQUEST_VALIDITY_PERIOD, 10 minutes; the server passes its auto-scaler's mute time).
    cold_marker_ms: int = 600_000

    def __post_init__(self) -> None:
        if self.max_lease_ms <= 0:
            raise ValueError(f"max_lease_ms must be positive, got {self.max_lease_ms}")
        if not 0 < self.min_lease_ms <= self.max_lease_ms:
            raise ValueError(f"min_lease_ms must be within 1..max_lease_ms, got {self.min_lease_ms}")
        if self.lease_cap_ms is not None and self.lease_cap_ms <= 0:
            raise ValueError(f"lease_cap_ms must be positive or None, got {self.lease_cap_ms}")
        if not 0.05 <= self.lease_check_interval_s <= 1.0:
            raise ValueError(f"lease_check_interval_s must be within 0.05..1 s, got {self.lease_check_interval_s}")
        if self.max_execution_time_ms <= 0:
            raise ValueError(f"max_execution_time_ms must be positive, got {self.max_execution_time_ms}")
        if self.snapshot_every < 1:
            raise ValueError(f"snapshot_every must be at least 1, got {self.snapshot_every}")
        if self.list_page_size < 1:
            raise ValueError(f"list_page_size must be at least 1, got {self.list_page_size}")
        if self.finished_txn_limit < 1:
            raise ValueError(f"finished_txn_limit must be at least 1, got {self.finished_txn_limit}")
        if self.finished_txn_retention_ms < 0:
            raise ValueError(f"finished_txn_retention_ms must not be negative, got {self.finished_txn_retention_ms}")
        if not self.retention_interval_s > 0:
            raise ValueError(f"retention_interval_s must be positive, got {self.retention_interval_s}")
