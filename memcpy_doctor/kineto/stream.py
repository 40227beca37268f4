"""A torch.profiler trace's JSON read as a stream: its `traceEvents` kept as rows of a store
(kineto/events.py) as they are parsed, never all held as dicts, so that reading a trace
takes the same memory whatever its size; and an execution trace's `nodes` the same way, each
kept as a small node (kineto/et.py) rather than a dict (`read_array`).

How. The file (`.json`, or `.json.gz` decompressed as it is read) goes in chunks through
ijson's C parser (yajl2_c), which hands over each element of the top-level `traceEvents`
array as a dict, at once cut to a row. The parser validates the whole document; the rest
of the top-level object (`deviceProperties`, `distributedInfo`, ...) is decoded by the
standard library from the bytes kept around the array: those up to its first element, and
those from the chunk before the one where its last element ended. There, the array's end
is the first `]` after which the text reads as the rest of an object (`, "key": value ...
}` or `}`): a `]` inside the array cannot, as the array's own `]` would be left unclosed.

Where the stream cannot be used, the file is parsed whole by the standard library, as it
was before, and its events then read into the store: a document that is not an object holding a
`traceEvents` array with elements (an execution trace, a memcpy-doctor trace); a file yajl
refuses, so that an invalid file gets the standard library's message and one yajl alone
refuses (`NaN`, `1e400`) is still read; and when ijson's C backend is not installed (its
pure-Python backend would take minutes), which costs memory, not results.

Errors are TraceError with one line: a file that cannot be read, a truncated or corrupt
`.gz`, an empty file, or JSON that is not valid.
"""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any, BinaryIO

from .events import (STORE_ERRORS, Events, as_events, require_store, sqlite3,
                     store_error)
from ..core.trace import TraceError

try:  # the C backend only: see the module docstring
    from ijson import JSONError as _JSONError, get_backend as _get_backend
    _IJSON: Any = _get_backend("yajl2_c")
except ImportError:
    _IJSON = None

#: Bytes read and parsed at a time.
CHUNK_BYTES = 1 << 16
_DECODER = json.JSONDecoder()


class _Refused(Exception):
    """The stream cannot give this document; it is parsed whole instead."""


def streaming() -> bool:
    """Whether torch.profiler traces are read as a stream here (ijson's C backend is
    installed), not parsed whole."""
    return _IJSON is not None


def read_json(path: str, what: str = "a trace") -> Any:
    """The JSON of the `.json` or `.json.gz` file at `path`, a torch.profiler trace's
    `traceEvents` as Events (see the module docstring); TraceError, one line, when it cannot
    be read (`what` names what it should have been)."""
    try:
        if _IJSON is not None and sqlite3 is not None:  # (without sqlite3: see _whole)
            events = Events()
            try:
                data = _streamed(path, "traceEvents", events)
                data["traceEvents"] = events
                return data
            except _Refused:
                pass
        return _whole(path, what)
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror or e})") from None
    except STORE_ERRORS as e:
        raise store_error(path, e) from None


def read_array(path: str, key: str, sink: Any) -> dict[str, Any] | None:
    """The members of the top-level object of the `.json` or `.json.gz` file at `path` but
    its array `key`, whose elements go to `sink.read(elements)` as they are parsed (the sink
    counts them in `sink.seen`); None where the stream cannot give them (no C backend, not
    such an object, a file yajl refuses), for the caller to parse the file whole (read_whole)
    with a fresh sink. TraceError, one line, as read_json."""
    if _IJSON is None:
        return None
    try:
        return _streamed(path, key, sink)
    except _Refused:
        return None
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror or e})") from None


def read_whole(path: str, what: str = "a trace") -> Any:
    """The JSON of the `.json` or `.json.gz` file at `path`, parsed whole by the standard
    library (an execution trace: its nodes are all kept anyway); TraceError as read_json."""
    try:
        return json.loads(_text(path, _raw(path)))
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror or e})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: not {what} (not valid JSON: {e})") from None


def _raw(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _text(path: str, raw: bytes) -> str:
    """The text of a file's bytes, decompressed when they are gzip's; TraceError when they
    are a corrupt .gz or only white space."""
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise TraceError(f"{path}: a truncated or corrupt .gz file ({e})") from None
    if not raw.strip():
        raise TraceError(f"{path}: empty file")
    return raw.decode("utf-8")


def _whole(path: str, what: str) -> Any:
    """read_json by the standard library: the file parsed whole, its events then cut."""
    data = read_whole(path, what)
    if isinstance(data, dict) and isinstance(data.get("traceEvents"), list):
        require_store(path)
        data["traceEvents"] = as_events(data["traceEvents"])
    return data


def _streamed(path: str, key: str, sink: Any) -> dict[str, Any]:
    """The elements of the top-level array `key` through ijson into `sink`, and the other
    members; _Refused where it cannot be (see the module docstring)."""
    with open(path, "rb") as raw:
        source = _Chunks(path, raw, sink)
        try:
            sink.read(_IJSON.items(source, f"{key}.item", use_float=True,
                                   buf_size=CHUNK_BYTES))
        except (_JSONError, UnicodeDecodeError):
            raise _Refused from None
    if not sink.seen:
        raise _Refused  # an empty file, or no elements: parsed whole
    source.read(0)  # the tail from the chunk before the one where the last element ended
    data = _head(b"".join(source.head), key)
    data.update(_tail(b"".join(source.tail)))
    return data


class _Chunks:
    """The file's bytes as ijson reads them (decompressed, for a `.gz`), keeping those the
    top-level members can be in: the head, up to the chunk where the first element ended,
    and the tail, from the chunk before the one where the last element ended. ijson parses
    each chunk it reads before it reads the next, so the elements read since the last chunk
    was read ended in it; the chunk before is kept too, so that the tail holds the array's
    end even were ijson to read one chunk ahead."""

    def __init__(self, path: str, raw: BinaryIO, sink: Any) -> None:
        self.path, self.sink = path, sink
        self.source: BinaryIO = raw
        if raw.peek(2)[:2] == b"\x1f\x8b":
            self.source = gzip.GzipFile(fileobj=raw)
        self.head: list[bytes] = []
        self.tail: list[bytes] = []
        self._seen = 0  # the elements read when the last chunk was

    def read(self, size: int = -1) -> bytes:
        if self.sink.seen != self._seen:  # elements ended in the last chunk read
            self._seen = self.sink.seen
            del self.tail[:-2]
        if size == 0:
            return b""
        try:
            chunk = self.source.read(size)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise TraceError(f"{self.path}: a truncated or corrupt .gz file ({e})") from None
        if not self._seen:
            self.head.append(chunk)
        self.tail.append(chunk)
        return chunk


def _head(raw: bytes, array: str) -> dict[str, Any]:
    """The members of the top-level object before the array `array`, from the file's first
    bytes (the document is valid: the parser read it whole)."""
    text = _decoded(raw)
    pos = _skip(text, 0)
    if text[pos:pos + 1] != "{":
        raise _Refused
    out: dict[str, Any] = {}
    pos += 1
    while True:
        key, pos = _DECODER.raw_decode(text, _skip(text, pos))
        pos = _skip(text, _skip(text, pos) + 1)  # past the colon
        if key == array and text[pos:pos + 1] == "[":
            return out
        out[key], pos = _DECODER.raw_decode(text, pos)
        pos = _skip(text, _skip(text, pos) + 1)  # past the comma


def _tail(raw: bytes) -> dict[str, Any]:
    """The members of the top-level object after `traceEvents`, from the tail's bytes
    (_Chunks): those after the first `]` that can end the array (see the module docstring)."""
    text = _decoded(raw)
    at = text.find("]")
    while at >= 0:
        members = _members_after(text, at + 1)
        if members is not None:
            return members
        at = text.find("]", at + 1)
    raise _Refused  # not reached for a valid document


def _members_after(text: str, pos: int) -> dict[str, Any] | None:
    """The members `, "key": value ... }` (or `}`) that end the document at `pos`; None
    when the text there is not that."""
    out: dict[str, Any] = {}
    pos = _skip(text, pos)
    try:
        while text[pos:pos + 1] == ",":
            pos = _skip(text, pos + 1)
            if text[pos:pos + 1] != '"':
                return None
            key, pos = _DECODER.raw_decode(text, pos)
            pos = _skip(text, pos)
            if text[pos:pos + 1] != ":":
                return None
            out[key], pos = _DECODER.raw_decode(text, _skip(text, pos + 1))
            pos = _skip(text, pos)
    except ValueError:
        return None
    if text[pos:pos + 1] != "}" or _skip(text, pos + 1) != len(text):
        return None
    return out


def _decoded(raw: bytes) -> str:
    """Bytes of a valid document as text, a character cut at either end left out."""
    for start in range(4):
        try:
            return raw[start:].decode("utf-8")
        except UnicodeDecodeError as e:
            if e.start >= len(raw) - start - 4:  # cut at the end: keep what is whole
                return raw[start:start + e.start].decode("utf-8", "ignore")
    return raw.decode("utf-8", "ignore")


def _skip(text: str, pos: int) -> int:
    """The position of the next character in `text` that is not white space."""
    while pos < len(text) and text[pos] in " \t\n\r":
        pos += 1
    return pos
