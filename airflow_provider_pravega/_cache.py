"""Where the project keeps what it downloads or builds (jars, sdists, the Spark Connect plugin):
outside the repository. Shared by ``testing/`` and ``spark/`` (no imports of its own)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(name: str, env: str | None = None) -> Path:
    """``$<env>`` if set, else ``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/airflow-provider-pravega/<name>``.

    scripts/pravega_standalone.py follows the same rule with its own few lines: it is standard
    library only, so it runs before the project is installed."""
    if env and os.environ.get(env):
        return Path(os.environ[env]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "airflow-provider-pravega" / name
