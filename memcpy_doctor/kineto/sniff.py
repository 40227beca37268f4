"""Whether a file is a torch.profiler trace, from its first bytes: asked of every trace a
command reads, so it imports nothing of the readers (a memcpy-doctor trace needs none of
them)."""

from __future__ import annotations


def is_kineto_file(path: str) -> bool:
    """Whether the file at `path` looks like a torch.profiler trace: gzip-compressed, or JSON
    whose first keys are Kineto's (`schemaVersion`, `traceEvents`), not memcpy-doctor's."""
    try:
        with open(path, "rb") as f:
            head = f.read(1024)
    except OSError:
        return False
    return head[:2] == b"\x1f\x8b" or b'"schemaVersion"' in head or (
        b'"traceEvents"' in head and b'"schema_version"' not in head)
