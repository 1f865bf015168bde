"""The stream-cut value type: a position in one stream (segment id -> byte offset).

Why a type of our own: the official binding's ``StreamCuts`` has no text form and no constructor,
so a cut could neither be stored in XCom nor handed to a Java/Flink job. ``StreamCut`` is an
immutable, hashable, picklable value with

* Java's text form (``to_text``/``from_text``: byte for byte what ``StreamCut.asText()`` prints and
  what ``StreamCut.from(text)`` parses), through :mod:`airflow_provider_pravega.protocol.streamcut`;
* a JSON form for XCom (``to_json``/``from_json``);
* constructors that read a live stream: :meth:`StreamCut.head` (the controller's getSegments at
  time 0), :meth:`StreamCut.tail` (current segments and their write offsets) and
  :meth:`StreamCut.from_reader_group` (an official reader group's position);
* *symbolic* cuts (``StreamCut.symbolic(scope, stream, HEAD)``): "the head/tail of this stream",
  resolved against the live stream only when used (:meth:`resolve`), so a DAG can say "from the
  head" without knowing the segments.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, Literal

from airflow_provider_pravega.client.errors import InvalidStreamCutError
from airflow_provider_pravega.protocol import naming
from airflow_provider_pravega.protocol import streamcut as codec

__all__ = ["HEAD", "TAIL", "StreamCut", "StreamCutMismatchError", "controller_of", "segments_of"]

HEAD: Literal["head"] = "head"
TAIL: Literal["tail"] = "tail"
Bound = Literal["head", "tail"]
_BOUNDS = (HEAD, TAIL)
_I64_MAX = (1 << 63) - 1


class StreamCutMismatchError(InvalidStreamCutError):
    """A cut of one stream was given where a cut of another stream is needed."""

    def __init__(self, expected: str, actual: str, what: str = "stream cut") -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"the {what} belongs to stream {actual}, but stream {expected} is being read; take the cut "
            f"from {expected} (cuts cannot be moved between streams)"
        )


def controller_of(client: Any) -> Any:
    """The ControllerClient of a PravegaClient (or the argument itself when it is one)."""
    return _part_of(client, "controller", "get_segments_at_head", "ControllerClient")


def segments_of(client: Any) -> Any:
    """The SegmentStoreClient of a PravegaClient (or the argument itself when it is one)."""
    return _part_of(client, "segments", "get_segment_info", "SegmentStoreClient")


def _part_of(client: Any, attribute: str, method: str, kind: str) -> Any:
    """A PravegaClient's ``attribute``, or ``client`` itself when it has ``method`` (is that part)."""
    part = getattr(client, attribute, None)
    if part is not None:
        return part
    if hasattr(client, method):
        return client
    raise TypeError(f"expected a PravegaClient or a {kind}, got {type(client).__name__}")


def _check_position(segment_id: Any, offset: Any) -> tuple[int, int]:
    if isinstance(segment_id, bool) or not isinstance(segment_id, int):
        raise InvalidStreamCutError(f"stream cut segment ids must be integers, got {segment_id!r}")
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise InvalidStreamCutError(f"stream cut offsets must be integers, got {offset!r} for segment {segment_id}")
    if not 0 <= segment_id <= _I64_MAX or (segment_id & 0xFFFF_FFFF) > 0x7FFF_FFFF:
        raise InvalidStreamCutError(
            f"segment id {segment_id} is not a Pravega segment id (epoch << 32 | number, both 0..2**31-1)"
        )
    if not 0 <= offset <= _I64_MAX:
        raise InvalidStreamCutError(f"stream cut offset {offset} of segment {segment_id} must be >= 0")
    return segment_id, offset


class StreamCut:
    """A position in ``scope/stream``: ``positions`` maps segment id -> byte offset.

    Concrete cuts list their segments; symbolic cuts (``bound`` is ``"head"`` or ``"tail"``) have
    no positions until :meth:`resolve`. Instances are immutable, hashable and picklable, and
    compare by stream and positions.
    """

    __slots__ = ("_bound", "_items", "_positions", "scope", "stream")

    scope: str
    stream: str

    def __init__(
        self,
        scope: str,
        stream: str,
        positions: Mapping[int, int] | Iterator[tuple[int, int]] | tuple[tuple[int, int], ...] = (),
        *,
        bound: Bound | None = None,
    ) -> None:
        try:
            naming.validate_scope_name(scope, allow_internal=True)
            naming.validate_stream_name(stream, allow_internal=True)
        except ValueError as exc:
            raise InvalidStreamCutError(f"stream cut names an invalid stream {scope!r}/{stream!r}: {exc}") from None
        pairs = positions.items() if isinstance(positions, Mapping) else positions
        items: dict[int, int] = {}
        for segment_id, offset in pairs:
            segment_id, offset = _check_position(segment_id, offset)
            if segment_id in items:
                raise InvalidStreamCutError(f"stream cut lists segment {segment_id} twice")
            items[segment_id] = offset
        if bound is not None:
            if bound not in _BOUNDS:
                raise InvalidStreamCutError(f"a symbolic stream cut is 'head' or 'tail', got {bound!r}")
            if items:
                raise InvalidStreamCutError(f"a symbolic {bound} cut of {scope}/{stream} cannot list positions")
        elif not items:
            raise InvalidStreamCutError(
                f"a stream cut of {scope}/{stream} needs at least one segment position; for 'from the "
                f"beginning' or 'up to the end' use StreamCut.symbolic(scope, stream, 'head' or 'tail')"
            )
        ordered = tuple(sorted(items.items()))
        object.__setattr__(self, "scope", scope)
        object.__setattr__(self, "stream", stream)
        object.__setattr__(self, "_bound", bound)
        object.__setattr__(self, "_items", ordered)
        object.__setattr__(self, "_positions", MappingProxyType(dict(ordered)))

    # --------------------------------------------------------------------- value behaviour

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"StreamCut is immutable (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"StreamCut is immutable (cannot delete {name!r})")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.scope, self.stream, self._items, self._bound))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StreamCut):
            return NotImplemented
        return (self.scope, self.stream, self._bound, self._items) == (
            other.scope,
            other.stream,
            other._bound,
            other._items,
        )

    def __hash__(self) -> int:
        return hash((self.scope, self.stream, self._bound, self._items))

    def __repr__(self) -> str:
        if self._bound is not None:
            return f"StreamCut.symbolic({self.scope!r}, {self.stream!r}, {self._bound!r})"
        return f"StreamCut({self.scope!r}, {self.stream!r}, {dict(self._items)!r})"

    def __str__(self) -> str:
        """The Java text form (what ``asText()`` prints); symbolic cuts print as ``head:scope/stream``."""
        if self._bound is not None:
            return f"{self._bound}:{self.scoped_stream}"
        return self.to_text()

    # -------------------------------------------------------------------------- accessors

    @property
    def positions(self) -> Mapping[int, int]:
        """Read-only mapping segment id -> offset (empty for a symbolic cut)."""
        return self._positions

    @property
    def bound(self) -> Bound | None:
        """``"head"``/``"tail"`` for a symbolic cut, None for a concrete one."""
        return self._bound

    @property
    def is_symbolic(self) -> bool:
        return self._bound is not None

    @property
    def scoped_stream(self) -> str:
        return f"{self.scope}/{self.stream}"

    @property
    def segment_ids(self) -> tuple[int, ...]:
        return tuple(segment_id for segment_id, _ in self._items)

    def check_stream(self, scope: str, stream: str, what: str = "stream cut") -> StreamCut:
        """Return self when it is a cut of ``scope/stream``, else raise StreamCutMismatchError."""
        if (self.scope, self.stream) != (scope, stream):
            raise StreamCutMismatchError(f"{scope}/{stream}", self.scoped_stream, what)
        return self

    # ------------------------------------------------------------------------ constructors

    @classmethod
    def symbolic(cls, scope: str, stream: str, bound: Bound) -> StreamCut:
        """The head or the tail of ``scope/stream``, to be resolved when the cut is used."""
        return cls(scope, stream, (), bound=bound)

    @classmethod
    def head(cls, client: Any, scope: str, stream: str) -> StreamCut:
        """Where reading the stream from its beginning starts now (after any truncation)."""
        positions = controller_of(client).get_segments_at_head(scope, stream)
        if not positions:
            raise InvalidStreamCutError(f"the controller reports no head segments for {scope}/{stream}")
        return cls(scope, stream, positions)

    @classmethod
    def tail(cls, client: Any, scope: str, stream: str) -> StreamCut:
        """The end of the data written so far: every current segment at its write offset (for a
        sealed stream, the segments it ended with at their final lengths)."""
        controller = controller_of(client)
        segments = segments_of(client)
        current = controller.get_last_segments(scope, stream)
        if not current:
            raise InvalidStreamCutError(f"the controller reports no segments at the end of {scope}/{stream}")
        positions = {
            seg.segment_id: segments.get_segment_info(
                naming.qualified_segment_name(scope, stream, seg.segment_id)
            ).length
            for seg in current
        }
        return cls(scope, stream, positions)

    @classmethod
    def from_reader_group(cls, stream_cuts: Any, scope: str, stream: str) -> StreamCut:
        """The position of an official reader group: its ``get_streamcut()`` result (or the
        ``StreamReaderGroup`` itself). The official object does not say which stream it is for
        (for a group over several streams it is an arbitrary one of them), so the caller names it."""
        if hasattr(stream_cuts, "get_streamcut") and not hasattr(stream_cuts, "get_segment_offset_map"):
            stream_cuts = stream_cuts.get_streamcut()
        try:
            offsets = stream_cuts.get_segment_offset_map()
        except AttributeError:
            raise TypeError(
                f"expected pravega_client.StreamCuts (from StreamReaderGroup.get_streamcut()), got "
                f"{type(stream_cuts).__name__}"
            ) from None
        return cls(scope, stream, {int(k): int(v) for k, v in dict(offsets).items()})

    def resolve(self, client: Any) -> StreamCut:
        """A concrete cut: self when concrete, else the stream's current head or tail."""
        if self._bound == HEAD:
            return StreamCut.head(client, self.scope, self.stream)
        if self._bound == TAIL:
            return StreamCut.tail(client, self.scope, self.stream)
        return self

    # ---------------------------------------------------------------------------- text form

    def to_text(self, *, order: codec.Order = "java") -> str:
        """Java ``StreamCut.asText()`` (base64 of gzip); ``order="java"`` matches Java byte for byte."""
        if self._bound is not None:
            raise InvalidStreamCutError(
                f"the symbolic {self._bound} cut of {self.scoped_stream} has no text form; resolve it "
                f"against the stream first (cut.resolve(client))"
            )
        try:
            return codec.streamcut_to_text(self.scope, self.stream, self._positions, order=order)
        except ValueError as exc:
            raise InvalidStreamCutError(f"cannot write stream cut of {self.scoped_stream} as text: {exc}") from None

    @classmethod
    def from_text(
        cls,
        text: str,
        *,
        scope: str | None = None,
        stream: str | None = None,
        unbounded: Bound | None = None,
    ) -> StreamCut:
        """Parse Java's text form. With ``scope``/``stream`` the cut must belong to that stream.

        Java's ``UNBOUNDED`` names no stream and means the head for a start cut and the tail for
        an end cut: it is accepted only with ``scope``, ``stream`` and ``unbounded`` ("head"/"tail").
        """
        try:
            parsed = codec.streamcut_from_text(text)
        except codec.InvalidStreamCutText as exc:
            raise InvalidStreamCutError(f"invalid stream cut text: {exc}") from None
        if parsed is None:
            if scope is None or stream is None or unbounded is None:
                raise InvalidStreamCutError(
                    "the stream cut text 'UNBOUNDED' names no stream and no direction; pass scope=, stream= "
                    "and unbounded='head' (for a start cut) or 'tail' (for an end cut)"
                )
            return cls.symbolic(scope, stream, unbounded)
        cut = cls(parsed.scope, parsed.stream, parsed.positions)
        if scope is not None or stream is not None:
            cut.check_stream(scope if scope is not None else cut.scope, stream if stream is not None else cut.stream)
        return cut

    # ---------------------------------------------------------------------------- JSON form

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict for XCom: scope, stream, positions {"<segment id>": offset}, text
        (and ``bound`` for a symbolic cut, whose positions are empty and text is None)."""
        out: dict[str, Any] = {
            "scope": self.scope,
            "stream": self.stream,
            "positions": {str(segment_id): offset for segment_id, offset in self._items},
            "text": None if self._bound is not None else self.to_text(),
        }
        if self._bound is not None:
            out["bound"] = self._bound
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> StreamCut:
        """Inverse of :meth:`to_json` (also accepts the dict serialized as a JSON string).

        Either ``positions`` or ``text`` suffices; when both are there they must agree.
        """
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as exc:
                raise InvalidStreamCutError(f"stream cut JSON is not valid JSON: {exc.msg}") from None
        if not isinstance(data, Mapping):
            raise InvalidStreamCutError(f"stream cut JSON must be an object, got {type(data).__name__}")
        scope, stream = data.get("scope"), data.get("stream")
        if not isinstance(scope, str) or not isinstance(stream, str):
            raise InvalidStreamCutError("stream cut JSON needs string fields 'scope' and 'stream'")
        bound = data.get("bound")
        if bound is not None:
            if data.get("positions"):
                raise InvalidStreamCutError(f"a symbolic {bound!r} cut in JSON cannot list positions")
            return cls.symbolic(scope, stream, bound)
        raw_positions = data.get("positions")
        text = data.get("text")
        from_positions: StreamCut | None = None
        if raw_positions is not None:
            if not isinstance(raw_positions, Mapping):
                raise InvalidStreamCutError("stream cut JSON 'positions' must be an object {segment id: offset}")
            pairs = []
            for key, value in raw_positions.items():
                try:
                    pairs.append((int(key), value))
                except (TypeError, ValueError):
                    raise InvalidStreamCutError(f"stream cut JSON has a non-numeric segment id {key!r}") from None
            from_positions = cls(scope, stream, pairs)
        if text is not None:
            from_text = cls.from_text(text, scope=scope, stream=stream)
            if from_positions is not None and from_positions != from_text:
                raise InvalidStreamCutError(
                    f"stream cut JSON for {scope}/{stream} is inconsistent: positions "
                    f"{dict(from_positions.positions)} but text {dict(from_text.positions)}"
                )
            return from_text
        if from_positions is None:
            raise InvalidStreamCutError("stream cut JSON needs 'positions' or 'text' (or 'bound')")
        return from_positions

    # ------------------------------------------------------------------------- coercion

    @classmethod
    def coerce(
        cls, value: Any, scope: str, stream: str, *, unbounded: Bound | None = None, what: str = "stream cut"
    ) -> StreamCut:
        """Accept what a DAG author may write for a cut of ``scope/stream``: a StreamCut, "head",
        "tail", Java text (``UNBOUNDED`` means ``unbounded``), or the JSON dict/string of to_json."""
        if isinstance(value, StreamCut):
            return value.check_stream(scope, stream, what)
        if isinstance(value, str):
            word = value.strip()
            if word.lower() in _BOUNDS:
                return cls.symbolic(scope, stream, word.lower())  # type: ignore[arg-type]
            if word.startswith("{"):
                return cls.from_json(word).check_stream(scope, stream, what)
            return cls.from_text(word, scope=scope, stream=stream, unbounded=unbounded)
        if isinstance(value, Mapping):
            return cls.from_json(value).check_stream(scope, stream, what)
        raise InvalidStreamCutError(
            f"cannot use {type(value).__name__} as a {what} of {scope}/{stream}: give a StreamCut, 'head', "
            f"'tail', a stream cut text or its JSON form"
        )


def _rebuild(scope: str, stream: str, items: tuple[tuple[int, int], ...], bound: Bound | None) -> StreamCut:
    return StreamCut(scope, stream, items, bound=bound)
