"""Where tests and benchmarks keep what they download (jars, sdists): outside the repository."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(name: str, env: str | None = None) -> Path:
    """``$<env>`` if set, else ``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/airflow-provider-pravega/<name>``.

    scripts/pravega_standalone.py follows the same rule with its own few lines: it is standard
    library only, so it runs before the project is installed; so does spark/connect_plugin (the
    ``spark/`` layer does not import ``testing/``)."""
    if env and os.environ.get(env):
        return Path(os.environ[env]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "airflow-provider-pravega" / name
