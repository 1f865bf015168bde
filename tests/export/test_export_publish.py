"""Publishing an export where a directory rename is not atomic (object stores): the order of the
moves, observed on the real Hadoop local filesystem with the object-store protocol chosen.

A reader that waits for ``_PRAVEGA_EXPORT.json`` must never see it next to a partial or stale set
of files, and a publish interrupted half-way must be finished by the next run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pravega.spark.export_job import MARKER, PENDING_MARKER, OutputLocation


class _Watched:
    """The real Hadoop FileSystem; before every rename and delete it records what a reader of the
    final directory would see at that moment (and can stop the publish there, like a crash)."""

    def __init__(self, fs: Any, final: Path, stop_after_renames: int | None = None) -> None:
        self._fs, self._final, self._stop = fs, final, stop_after_renames
        self.seen: list[set[str]] = []
        self.renames = 0

    def _look(self) -> None:
        self.seen.append(_names(self._final) if self._final.is_dir() else set())

    def rename(self, src: Any, dst: Any) -> bool:
        if self._stop is not None and self.renames >= self._stop:
            raise RuntimeError("publish stopped here (a crash)")
        self._look()
        self.renames += 1
        ok = self._fs.rename(src, dst)
        self._look()
        return ok

    def delete(self, path: Any, recursive: bool) -> bool:
        ok = self._fs.delete(path, recursive)
        self._look()
        return ok

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)


def _names(directory: Path) -> set[str]:
    """What a reader lists (Hadoop's local filesystem adds hidden ``.*.crc`` checksum files)."""
    return {p.name for p in directory.iterdir() if not p.name.startswith(".")}


def _staged(spark: Any, final: Path, parts: dict[str, str]) -> OutputLocation:
    """An OutputLocation on the object-store path whose temporary directory holds ``parts`` and
    the marker listing them, as ``run_export`` leaves it before publishing."""
    location = OutputLocation(spark, str(final))
    location.object_store = True
    temp = Path(location.temp)
    temp.mkdir(parents=True)
    for name, text in parts.items():
        (temp / name).write_text(text)
    (temp / MARKER).write_text(json.dumps({"export_id": "e", "interval": None, "files": sorted(parts)}))
    return location


def _check_reader_view(seen: list[set[str]], final_parts: set[str]) -> None:
    for view in seen:
        if MARKER in view:  # complete whenever the marker is there: exactly the listed files
            assert view - {MARKER, PENDING_MARKER} == final_parts, view


def test_in_place_publish_writes_the_marker_last_and_removes_stale_files(spark: Any, tmp_path: Path) -> None:
    final = tmp_path / "out" / "day"
    first = _staged(spark, final, {"part-00000.parquet": "a", "part-00001.parquet": "b"})
    first.publish(replace=False)
    assert _names(final) == {MARKER, "part-00000.parquet", "part-00001.parquet"}
    assert not Path(first.temp).exists()

    second = _staged(spark, final, {"part-00000.parquet": "a2"})  # a replacement with one file less
    watched = _Watched(second.fs, final)
    second.fs = watched
    second.publish(replace=True)
    assert _names(final) == {MARKER, "part-00000.parquet"}
    assert (final / "part-00000.parquet").read_text() == "a2"
    _check_reader_view(watched.seen, {"part-00000.parquet"})
    assert any(MARKER not in view and PENDING_MARKER in view for view in watched.seen)  # in flux, and said so


@pytest.mark.parametrize("stop_after", [0, 1, 2])
def test_an_interrupted_publish_is_finished_by_the_next_run(spark: Any, tmp_path: Path, stop_after: int) -> None:
    final = tmp_path / "out" / "day"
    parts = {"part-00000.parquet": "a", "part-00001.parquet": "b"}
    crashed = _staged(spark, final, parts)
    crashed.fs = watched = _Watched(crashed.fs, final, stop_after_renames=stop_after)
    with pytest.raises(RuntimeError, match="a crash"):
        crashed.publish(replace=False)
    assert MARKER not in _names(final)  # never complete-looking
    _check_reader_view(watched.seen, set(parts))

    rerun = _staged(spark, final, parts)
    found = rerun.existing()  # the pending marker says the directory is this export's
    assert found is not None and found["export_id"] == "e"
    rerun.publish(replace=True)
    assert _names(final) == {MARKER, *parts}
