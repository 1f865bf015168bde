"""Apache Airflow provider for Pravega streams.

Airflow finds this provider through the ``apache_airflow_provider`` entry point, which calls
:func:`get_provider_info`. This module imports nothing from Airflow so that the client layer and
Spark tasks can import the package without it.
"""

from __future__ import annotations

import pkgutil
from functools import lru_cache
from importlib import resources
from typing import Any

__version__ = "0.1.0"

_INTEGRATION = "Pravega"
# Provider-info sections filled from the modules present in these subpackages.
_DISCOVERED_SECTIONS = ("operators", "sensors", "triggers")


@lru_cache(maxsize=1)
def _provider_yaml() -> dict[str, Any]:
    # import cost: every Spark Python worker imports this package; only provider discovery reads provider.yaml
    import yaml

    text = resources.files(__name__).joinpath("provider.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise RuntimeError("airflow_provider_pravega/provider.yaml is not a YAML mapping")
    return data


def _modules_of(subpackage: str) -> list[str]:
    """Public modules of ``airflow_provider_pravega.<subpackage>``, found without importing them."""
    package = f"{__name__}.{subpackage}"
    try:
        path = resources.files(package)
    except ModuleNotFoundError:
        return []
    return sorted(
        f"{package}.{info.name}"
        for info in pkgutil.iter_modules([str(path)])
        if not info.name.startswith("_")
    )


def get_provider_info() -> dict[str, Any]:
    """Describe this provider to Airflow's ProvidersManager (Airflow 3 provider-info format)."""
    data = {
        key: value
        for key, value in _provider_yaml().items()
        if key not in ("state", "source-date-epoch")  # release metadata, not provider info
    }
    data["versions"] = list(data.get("versions") or [__version__])
    data["hook-class-names"] = [ct["hook-class-name"] for ct in data.get("connection-types", [])]
    for section in _DISCOVERED_SECTIONS:
        modules = _modules_of(section)
        if modules:
            data[section] = [{"integration-name": _INTEGRATION, "python-modules": modules}]
    return data
