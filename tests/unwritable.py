"""A directory that refuses new entries, for tests of unwritable paths (the suite may run as root)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def unwritable(path: Path) -> Iterator[None]:
    """Make the directory ``path`` refuse new entries, for root too: chmod does not stop root, the
    immutable attribute (chattr +i, needs CAP_LINUX_IMMUTABLE and an ext/xfs/btrfs filesystem) does."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(0o755)
        return
    r = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True) if shutil.which("chattr") else None
    if r is None or r.returncode != 0:
        pytest.skip(f"running as root and cannot make {path} immutable (chattr +i: "
                    f"{r.stderr.strip() if r else 'not installed'}): no way to deny root writing there")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
