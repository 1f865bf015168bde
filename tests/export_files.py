"""What an export left at its output path, as tests compare it across runs."""

from __future__ import annotations

import re
from pathlib import Path

#: Spark names each write's files ``part-<partition>-<write UUID>-c<n>.<suffix>``.
_WRITE_UUID = re.compile(r"(part-\d+)-[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}(-c\d+)")


def part_files(path: str | Path) -> list[Path]:
    """The part files in name order (the export's plan order), without Hadoop's checksums."""
    return sorted(p for p in Path(path).iterdir() if p.name.startswith("part-") and not p.name.endswith(".crc"))


def stable_name(name: str) -> str:
    """A part file's name without the write's UUID: the same for every run of the same plan."""
    return _WRITE_UUID.sub(r"\1\2", name)


def by_partition(path: str | Path) -> dict[str, bytes]:
    """The part files' bytes by their stable names."""
    return {stable_name(p.name): p.read_bytes() for p in part_files(path)}
