"""The HTML report's picture of one steady step (issue 44): the host's lane above the
device's, as SVG, on the trace's timeline clock.

The host lane shows ops as spans and the host's waits (the sync copies it blocked in, its
synchronize calls) hatched; the device lane shows kernels and transfers, and its idle time
shaded. Each copy is an arrow between the lanes at its time (when its transfer began on the
device, else when the host made it), from the side that held the data; each sync copy is
labelled with its line and links to its row in the sync copies table. Spans too narrow to
see are folded into one span with their neighbours. Every element has a <title> (shown on
hover), and the figures drawn are also in the caption and the table, for a reader without
a mouse. The SVG carries its scale (`data-t0-ns`, `data-t1-ns`, `data-x0`, `data-x1`: the
axis from x0 to x1 is the time from t0 to t1) and each arrow its copy and time
(`data-ref`, `data-event`, `data-t-ns`), so a test can check where an arrow sits.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis.step import StepWindow
from ..core.trace import Trace
from .html_format import duration, esc, share, short_site, site_text, size

#: The viewBox: its width, and where the time axis starts and ends in it.
W, X0, X1 = 1000, 62, 985
HOST_Y, DEV_Y, LANE_H = 30, 126, 26
LABEL_ROWS = (73, 89, 105)  # the baselines of the sync copies' labels, between the lanes
AXIS_Y, HEIGHT = 164, 186
MIN_W = 3.0  # a span narrower than this (in viewBox units) folds into its neighbours
CHAR_W = 6.2  # the width of a label's character at font-size 11, about
#: copies drawn as arrows at most, sync and async apart (a step with more is a loop over
#: elements; the caption counts those left out)
MAX_ARROWS = {True: 1000, False: 200}


@dataclass(frozen=True)
class Item:
    """An event as drawn: its host span (None: not drawn on the host lane) and device span
    (None: host work, or outside the window), on the timeline's clock."""

    index: int
    kind: str
    ref: int
    host: tuple[int, int] | None
    device: tuple[int, int] | None


@dataclass(frozen=True)
class Lanes:
    """What one picture shows: `items`, in the window from `start_ns` to `end_ns`; `first`
    and `end` are the step's events (timeline indices), whose copies get arrows."""

    items: list[Item]
    start_ns: int
    end_ns: int
    first: int
    end: int


def step_lanes(trace: Trace, win: StepWindow) -> Lanes:
    """The step `win` as recorded: its events' host spans, and the device spans of any
    earlier event of the tracer's thread that ran on the device during the step."""
    events = trace.timeline.events
    items = []
    for i in range(win.end):
        e = events[i]
        if e.thread is not None:
            continue
        host = (e.host_start_ns, e.host_end_ns) if i >= win.first else None
        dev = None
        if (e.device_start_ns is not None and e.device_end_ns > win.start_ns
                and e.device_start_ns < win.end_ns):
            dev = (e.device_start_ns, e.device_end_ns)
        if host is not None or dev is not None:
            items.append(Item(i, e.kind, e.ref, host, dev))
    return Lanes(items, win.start_ns, win.end_ns, win.first, win.end)


def replayed_lanes(trace: Trace, win: StepWindow,
                   spans: dict[int, tuple[int, int, int | None, int | None]]) -> Lanes | None:
    """The same step as analysis/replay.py plays it with the suggested edits made (`spans`:
    Replay.spans); None where none of its events is in the replayed window."""
    inside = sorted(i for i in spans if win.first <= i < win.end)
    if not inside:
        return None
    start = spans[inside[0]][0]
    later = [i for i in spans if i >= win.end]
    end = (spans[min(later)][0] if later
           else max(max(spans[i][1], spans[i][3] or 0) for i in inside))
    events = trace.timeline.events
    items = []
    for i in sorted(spans):
        if i >= win.end:
            break
        h0, h1, d0, d1 = spans[i]
        host = (h0, h1) if i >= win.first else None
        dev = (d0, d1) if d0 is not None and d1 > start and d0 < end else None
        if host is not None or dev is not None:
            items.append(Item(i, events[i].kind, events[i].ref, host, dev))
    return Lanes(items, start, end, win.first, win.end)


def _nice_step(ns: float) -> int:
    """A tick interval of 1, 2 or 5 times a power of ten ns, at least `ns`."""
    unit = 1
    while True:
        for m in (1, 2, 5):
            if unit * m >= ns:
                return unit * m
        unit *= 10


@dataclass
class _Span:
    start: int
    end: int
    cls: str
    title: str
    label: str = ""
    members: int = 1


class _Picture:
    """One SVG: the lanes of `lanes` at `scale` (viewBox units per ns)."""

    def __init__(self, trace: Trace, lanes: Lanes, scale: float, prefix: str,
                 numbers: dict[int, int], rows: str, cwd: str | None) -> None:
        self.trace, self.lanes, self.scale, self.prefix = trace, lanes, scale, prefix
        self.numbers, self.rows, self.cwd = numbers, rows, cwd
        self.parts: list[str] = []
        self.blocked_ns = self.idle_ns = 0
        self.sync_drawn: list[int] = []
        self.async_drawn = 0
        self.left = {True: 0, False: 0}  # copies not drawn past MAX_ARROWS, sync and async

    def x(self, t: float) -> float:
        return X0 + (min(max(t, self.lanes.start_ns), self.lanes.end_ns)
                     - self.lanes.start_ns) * self.scale

    # ----- what each event is, in words -----
    def describe(self, item: Item) -> tuple[str, str, bool]:
        """(title, short label, sync) of an event."""
        t = self.trace
        if item.kind == "op" and item.ref < len(t.ops):
            op = t.ops[item.ref]
            name = op.op.split("::")[-1]
            return (f"{esc(op.op)} [{esc(op.device)}] at {site_text(op.site, self.cwd)}",
                    name, False)
        if item.kind == "copy" and item.ref < len(t.copies):
            c = t.copies[item.ref]
            kind = "sync" if c.sync else "async"
            each = size(c.bytes // max(c.calls, 1))
            return (f"{esc(c.direction)} {kind} copy `{esc(c.trigger)}` of {each}"
                    f" at {site_text(c.site, self.cwd)}", c.trigger, c.sync)
        if item.kind == "wait" and item.ref < len(t.waits):
            w = t.waits[item.ref]
            return f"host wait: {esc(w.kind)} at {site_text(w.site, self.cwd)}", w.kind, True
        return f"{esc(item.kind)} #{item.ref}", item.kind, False

    # ----- the lanes -----
    def _lane(self, spans: list[_Span], y: int) -> None:
        """Draw `spans` on the lane at `y`, folding runs of narrow foldable ones."""
        spans.sort(key=lambda s: (s.start, s.end))
        group: list[_Span] = []
        group_end = 0

        def flush() -> None:
            if len(group) == 1:
                self._rect(group[0], y)
            elif group:
                names: dict[str, int] = {}
                for s in group:
                    names[s.label] = names.get(s.label, 0) + 1
                top = sorted(names.items(), key=lambda kv: -kv[1])[:4]
                busy = sum(s.end - s.start for s in group)
                words = ", ".join(f"{esc(n)} ×{k}" for n, k in top)
                more = ", …" if len(names) > 4 else ""
                self._rect(_Span(group[0].start, max(s.end for s in group), "folded",
                                 f"{len(group)} short spans folded, {duration(busy)} busy: "
                                 f"{words}{more}", "", len(group)), y)
            group.clear()

        gap = MIN_W / self.scale
        for s in spans:
            narrow = (s.end - s.start) * self.scale < MIN_W
            if narrow and s.cls in ("op", "kernel", "launch", "xfer"):
                if group and s.start - group_end > gap:
                    flush()
                group_end = max(group_end, s.end) if group else s.end
                group.append(s)
                continue
            flush()
            self._rect(s, y)
        flush()

    def _rect(self, s: _Span, y: int) -> None:
        x0, x1 = self.x(s.start), self.x(s.end)
        w = max(x1 - x0, 1.0)
        extra = f' data-folded="{s.members}"' if s.members > 1 else ""
        text = ""
        room = int((w - 6) / CHAR_W)
        if s.label and room >= 3:
            label = s.label if len(s.label) <= room else s.label[:room - 1] + "…"
            text = (f'<text class="in" x="{x0 + 3:.1f}" y="{y + LANE_H / 2 + 4:.1f}">'
                    f'{esc(label)}</text>')
        self.parts.append(
            f'<g class="span {s.cls}"{extra}><title>{s.title} ({duration(s.end - s.start)})'
            f'</title><rect x="{x0:.1f}" y="{y}" width="{w:.1f}" height="{LANE_H}"/>'
            f'{text}</g>')

    def lanes_and_shading(self) -> None:
        host: list[_Span] = []
        device: list[_Span] = []
        busy: list[tuple[int, int]] = []
        lo, hi = self.lanes.start_ns, self.lanes.end_ns
        for item in self.lanes.items:
            title, label, sync = self.describe(item)
            if item.host is not None:
                h0, h1 = max(item.host[0], lo), min(item.host[1], hi)
                if h1 >= h0:
                    if sync or item.kind == "wait":
                        cls = "blocked"
                        self.blocked_ns += h1 - h0
                        words = "the host waits in it: "
                    else:
                        cls = "op" if item.kind == "op" else "launch"
                        words = ""
                    host.append(_Span(h0, h1, cls, words + title, label))
            if item.device is not None:
                d0, d1 = max(item.device[0], lo), min(item.device[1], hi)
                if d1 > d0:
                    cls = "kernel" if item.kind == "op" else ("xfer sync" if sync else "xfer")
                    device.append(_Span(d0, d1, cls, "on the device: " + title, label))
                    busy.append((d0, d1))
        self._idle(busy)
        self._lane(host, HOST_Y)
        self._lane(device, DEV_Y)

    def _idle(self, busy: list[tuple[int, int]]) -> None:
        """The device's idle time in the window, shaded under its lane's spans."""
        cursor = self.lanes.start_ns
        gaps = []
        for d0, d1 in sorted(busy) + [(self.lanes.end_ns, self.lanes.end_ns)]:
            if d0 > cursor:
                gaps.append((cursor, d0))
            cursor = max(cursor, d1)
        for g0, g1 in gaps:
            self.idle_ns += g1 - g0
            x0, x1 = self.x(g0), self.x(g1)
            self.parts.append(
                f'<rect class="idle" x="{x0:.1f}" y="{DEV_Y - 4}" width="{x1 - x0:.1f}" '
                f'height="{LANE_H + 8}"><title>device idle {duration(g1 - g0)}</title></rect>')

    # ----- the copies -----
    def arrows(self) -> None:
        rows: list[list[tuple[float, float]]] = [[] for _ in LABEL_ROWS]
        lo, hi = self.lanes.start_ns, self.lanes.end_ns
        for item in self.lanes.items:
            if item.kind != "copy" or not self.lanes.first <= item.index < self.lanes.end:
                continue
            if item.ref >= len(self.trace.copies):
                continue
            c = self.trace.copies[item.ref]
            at = item.device[0] if item.device is not None else (
                item.host[0] if item.host is not None else None)
            if at is None or not lo <= at <= hi:
                continue
            if (len(self.sync_drawn) if c.sync else self.async_drawn) >= MAX_ARROWS[c.sync]:
                self.left[c.sync] += 1
                continue
            self.async_drawn += not c.sync
            self._arrow(item, c, at, rows)

    def _arrow(self, item: Item, c, at: int, rows: list[list[tuple[float, float]]]) -> None:
        x = self.x(at)
        top, bottom = HOST_Y + LANE_H + 1, DEV_Y - 3
        y1, y2 = {"HtoD": (top, bottom), "DtoH": (bottom + 2, top + 2),
                  "DtoD": (DEV_Y - 14, DEV_Y - 3)}.get(c.direction, (top, bottom))
        kind = "sync" if c.sync else "async"
        head = (f' marker-end="url(#{self.prefix}head-{kind})"'
                if c.direction in ("HtoD", "DtoH", "DtoD") else "")
        title = (f"{c.direction} {kind} copy `{esc(c.trigger)}` at {site_text(c.site, self.cwd)}"
                 f", at {duration(at - self.lanes.start_ns)} into the step")
        line = (f'<line x1="{x:.2f}" y1="{y1}" x2="{x:.2f}" y2="{y2}"{head}/>')
        attrs = (f'class="arrow {kind} {c.direction.lower()}" data-ref="{item.ref}" '
                 f'data-event="{item.index}" data-t-ns="{at}"')
        if not c.sync:
            self.parts.append(f'<g {attrs}><title>{title}</title>{line}</g>')
            return
        self.sync_drawn.append(item.ref)
        n = self.numbers.get(item.ref)
        label = self._label(x, f"#{n} {short_site(c.site)}" if n else short_site(c.site),
                            f"#{n}" if n else "", rows)
        body = line + label
        if n:  # (a link: the label is reached with Tab, and leads to the copy's row)
            body = f'<a href="#{self.rows}sync-{n}">{body}</a>'
        self.parts.append(f'<g {attrs}><title>{title}</title>{body}</g>')

    def _label(self, x: float, text: str, short: str,
               rows: list[list[tuple[float, float]]]) -> str:
        """A sync copy's label beside its arrow, on the first row between the lanes where it
        overlaps no other label; a shorter one, or none, where no row has room."""
        for words in (text, short):
            if not words:
                continue
            w = len(words) * CHAR_W
            left = x + 4 if x + 4 + w <= W - 4 else x - 4 - w
            for y, taken in zip(LABEL_ROWS, rows):
                if all(left + w + 4 <= a or left >= b + 4 for a, b in taken):
                    taken.append((left, left + w))
                    return (f'<text class="label" x="{left:.1f}" y="{y}">'
                            f'{esc(words)}</text>')
        return ""

    # ----- the frame -----
    def axis(self, width_ns: float) -> None:
        end_x = self.x(self.lanes.end_ns)
        self.parts.append(f'<line class="axis" x1="{X0}" y1="{AXIS_Y}" x2="{end_x:.2f}" '
                          f'y2="{AXIS_Y}"/>')
        step = _nice_step(width_ns / 7)
        t = 0
        while t <= self.lanes.end_ns - self.lanes.start_ns:
            tx = X0 + t * self.scale
            self.parts.append(
                f'<line class="tick" x1="{tx:.1f}" y1="{AXIS_Y}" x2="{tx:.1f}" '
                f'y2="{AXIS_Y + 4}"/><text class="tick" x="{tx:.1f}" y="{AXIS_Y + 16}">'
                f'{"0" if t == 0 else duration(t)}</text>')
            t += step
        for name, y in (("host", HOST_Y), ("device", DEV_Y)):
            self.parts.append(f'<text class="lane" x="4" y="{y + LANE_H / 2 + 4}">{name}</text>')

    def svg(self, label_id: str) -> str:
        p = self.prefix
        defs = ("<defs>"
                f'<pattern id="{p}hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
                'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fde2c8"/>'
                '<line x1="0" y1="0" x2="0" y2="6" stroke="#d9822b" stroke-width="3"/>'
                "</pattern>"
                + "".join(f'<marker id="{p}head-{k}" viewBox="0 0 8 8" refX="7" refY="4" '
                          f'markerWidth="6" markerHeight="6" orient="auto">'
                          f'<path d="M0,0 L8,4 L0,8 z" fill="{colour}"/></marker>'
                          for k, colour in (("sync", "#c0392b"), ("async", "#7f8c8d")))
                + "</defs>")
        style = f"<style>#{p}svg .blocked rect {{ fill: url(#{p}hatch); }}</style>"
        return (f'<svg id="{p}svg" class="timeline" viewBox="0 0 {W} {HEIGHT}" '
                f'preserveAspectRatio="xMinYMin meet" aria-labelledby="{label_id}" '
                f'data-t0-ns="{self.lanes.start_ns}" data-t1-ns="{self.lanes.end_ns}" '
                f'data-x0="{X0}" data-x1="{self.x(self.lanes.end_ns):.4f}">'
                f"{defs}{style}{''.join(self.parts)}</svg>")


def draw(trace: Trace, lanes: Lanes, scale: float, prefix: str, numbers: dict[int, int],
         rows: str, cwd: str | None, label_id: str, width_ns: float) -> tuple[str, _Picture]:
    """The SVG of `lanes` at `scale` (units per ns), its ids begun by `prefix`, and what it
    drew (its totals); a sync copy's arrow links to row `numbers[copy]` of the table whose
    row ids begin with `rows`."""
    pic = _Picture(trace, lanes, scale, prefix, numbers, rows, cwd)
    pic.lanes_and_shading()
    pic.axis(width_ns)
    pic.arrows()
    return pic.svg(label_id), pic


def facts(pic: _Picture) -> str:
    """The figures a picture shows, in words: for readers without a mouse or without the
    picture (the caption)."""
    span = pic.lanes.end_ns - pic.lanes.start_ns
    syncs = len(pic.sync_drawn)
    numbers = sorted({pic.numbers[r] for r in pic.sync_drawn if r in pic.numbers})
    which = f" ({', '.join(f'#{n}' for n in numbers)} in the table)" if numbers else ""
    async_words = (f", {pic.async_drawn} async cop{'y' if pic.async_drawn == 1 else 'ies'}"
                   if pic.async_drawn else "")
    left = "".join(f" ({n} more {'sync' if sync else 'async'} copies not drawn)"
                   for sync, n in pic.left.items() if n)
    return (f"{duration(span)}: the host waits {duration(pic.blocked_ns)} "
            f"({share(pic.blocked_ns, span)}), the device is idle {duration(pic.idle_ns)} "
            f"({share(pic.idle_ns, span)}); {syncs} sync cop{'y' if syncs == 1 else 'ies'}"
            f"{which}{async_words}{left}.")


__all__ = ["Lanes", "step_lanes", "replayed_lanes", "draw", "facts"]
