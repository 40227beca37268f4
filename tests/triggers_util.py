"""Run annotated scripts under the simulated GPU and compare their copies with the notes.

A line that copies carries `# expect: DIRECTION sync|async TRIGGER [pinned|pageable]`, several
separated by `;`; a line that waits carries `# wait: KIND`. Every copy and wait the tracer
records must be annotated, and every annotation must be recorded: nothing extra, nothing lost.
"""

from __future__ import annotations

import textwrap
from collections import Counter

from memcpy_doctor.run.runner import run_script
from memcpy_doctor.core.trace import Trace
from memcpy_doctor.tracer import Tracer


def run_case(tmp_path, source: str, name: str = "case.py", device: str = "sim"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    result = run_script(str(path), [], Tracer(device=device))
    return result, path


def expected(path) -> tuple[Counter, Counter]:
    copies: Counter = Counter()
    waits: Counter = Counter()
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if "# expect:" in line:
            for item in line.split("# expect:")[1].split(";"):
                words = item.split()
                pinned = None
                if len(words) == 4:
                    pinned = words[3] == "pinned"
                copies[(lineno, words[0], words[1] == "sync", words[2], pinned)] += 1
        if "# wait:" in line:
            waits[(lineno, line.split("# wait:")[1].strip())] += 1
    return copies, waits


def recorded(trace: Trace, path, with_pinned: set) -> tuple[Counter, Counter]:
    """Copy paths and waits at lines of `path`, as (line, direction, sync, trigger, pinned)."""
    copies: Counter = Counter()
    for c in trace.copies:
        assert c.site is not None and c.site.file == str(path), c
        key = (c.site.line, c.direction, c.sync, c.trigger)
        pinned = c.pinned if key in with_pinned else None
        copies[key + (pinned,)] += c.calls
    waits: Counter = Counter()
    for w in trace.waits:
        assert w.site is not None and w.site.file == str(path), w
        waits[(w.site.line, w.kind)] += w.calls
    return copies, waits


def check(tmp_path, source: str, device: str = "sim"):
    result, path = run_case(tmp_path, source, device=device)
    if result.exception is not None:
        raise result.exception
    want_copies, want_waits = expected(path)
    with_pinned = {k[:4] for k in want_copies if k[4] is not None}
    got_copies, got_waits = recorded(result.trace, path, with_pinned)
    assert got_copies == want_copies
    assert got_waits == want_waits
    return result.trace
