"""Lazy (PEP 562) re-exports for the operators/sensors/triggers packages.

Airflow's ProvidersManager imports those packages while reading ``get_provider_info()`` during its
own configuration start-up, when importing ``airflow.sdk`` would be circular; so a package names
its classes here and each is imported on first access.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(namespace: dict[str, Any], exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for a package whose ``namespace`` re-exports ``exports``
    (class name -> module)."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
