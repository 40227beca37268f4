"""The HTML report (render/html.py): exact structure on hand-built traces, the picture's scale
on a profiled sample, and the page in a real browser (headless Chromium, where installed).

The hand-built trace is tests/helpers.make_trace with a timeline of four steps of 100 us,
each: mm (host 0-10 us, device 10-40 us), add (host 12-20, device 40-50), the sync HtoD
`to` (host 22-60, device 50-55), add (host 62-70, device 70-80), the sync DtoH `item` (host
72-90, device 80-85). The steps are 10 (mm's calls), so mm marks each step; the timeline
holds three whole steps and the page draws the second: the host waits 38 + 18 = 56 us in it,
and the device is busy 30 + 10 + 5 + 10 + 5 = 60 us of its 100.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

import memcpy_doctor.render.html as html_module
from helpers import PROJECT_DIR, make_copies, make_trace
from memcpy_doctor.analysis.replay import Replay
from memcpy_doctor.analysis.step import pick_step
from memcpy_doctor.analysis.suggestion import REPLAYED, Suggestion
from memcpy_doctor.core.defaults import HTML_SYNC_PATHS
from memcpy_doctor.core.timeline import EventTimeline, TimelineEvent
from memcpy_doctor.core.trace import Site, Trace
from memcpy_doctor.render.html import render_html
from memcpy_doctor.render.html_tables import diff_html

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_models" / "shape_slice_crop.py"
STEP_NS = 100_000


def _step_events(t: int) -> list[TimelineEvent]:
    ev = TimelineEvent
    return [ev("op", 0, None, 0, t, t + 10_000, t + 10_000, t + 40_000),
            ev("op", 1, None, 0, t + 12_000, t + 20_000, t + 40_000, t + 50_000),
            ev("copy", 0, None, 0, t + 22_000, t + 60_000, t + 50_000, t + 55_000),
            ev("op", 1, None, 0, t + 62_000, t + 70_000, t + 70_000, t + 80_000),
            ev("copy", 1, None, 0, t + 72_000, t + 90_000, t + 80_000, t + 85_000)]


def timeline_trace(**overrides) -> Trace:
    """make_trace() with the four steps of the module docstring on its timeline."""
    trace = make_trace(**overrides)
    events = [e for k in range(4) for e in _step_events(k * STEP_NS)]
    trace.timeline = EventTimeline(10_000, 0, events)
    return trace


class Page(HTMLParser):
    """The page's elements: (tag, attributes) in order, the text of each element with a
    class, and every id."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.stack: list[tuple[str, dict[str, str], list[str]]] = []
        self.texts: list[tuple[str, dict[str, str], str]] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        self.elements.append((tag, a))
        if tag not in ("meta", "br", "rect", "line", "path", "input", "img", "link"):
            self.stack.append((tag, a, []))

    def handle_startendtag(self, tag, attrs):
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag):
        while self.stack:
            t, a, parts = self.stack.pop()
            text = "".join(parts)
            self.texts.append((t, a, text))
            if self.stack:
                self.stack[-1][2].append(text)
            if t == tag:
                break

    def handle_data(self, data):
        if self.stack:
            self.stack[-1][2].append(data)

    def find(self, tag: str, cls: str | None = None) -> list[dict[str, str]]:
        """The attributes of each `tag` element that has every class of `cls`."""
        want = set((cls or "").split())
        return [a for t, a in self.elements
                if t == tag and want <= set(a.get("class", "").split())]

    def text(self, tag: str, cls: str) -> list[str]:
        return [text for t, a, text in self.texts
                if t == tag and cls in a.get("class", "").split()]


def render(trace: Trace, **kw) -> str:
    return render_html([trace], ["trace.json"], cwd=PROJECT_DIR, **kw)


# ----- the headline -----

def test_the_headline_figures():
    trace = timeline_trace()
    trace.summary.peak_device_memory_bytes = 614_465_536
    text = render(trace)
    # 14 sync calls of two paths made every step, over 10 steps; 3 of the 10 ms
    for figure in ('<dt>Total time</dt><dd class="total">10 ms</dd>',
                   '<dt>Sync copies per step</dt><dd class="per-step">1.4<small>300 µs a '
                   'step; 10 steps, estimated</small></dd>',
                   '<dt>Their share of the time</dt><dd class="sync-share">30%<small>all sync '
                   'copies: 14 calls, 3 ms</small></dd>',
                   '<dt>Device memory peak</dt><dd class="peak">586.0 MiB</dd>',
                   '<dt>Where it ran</dt><dd class="where">simulated NVIDIA A100-SXM4-80GB: '
                   'device, copy and host times are modeled, not measured</dd>'):
        assert figure in text


def test_where_it_ran_for_each_kind_of_trace():
    assert html_module.where_it_ran(make_trace(simulated=False, device="cuda",
                                               device_name="NVIDIA H100")) == \
        "measured on NVIDIA H100"
    assert html_module.where_it_ran(make_trace(simulated=False, imported_from="a.json.gz")) \
        == "measured on NVIDIA A100-SXM4-80GB; imported from torch.profiler"
    assert html_module.where_it_ran(make_trace(light=True)).startswith(
        "light mode on simulated NVIDIA A100-SXM4-80GB: syncs counted at their lines, no ops")


def test_a_peak_not_known_and_nothing_repeating():
    trace = make_trace(copies=[dataclasses.replace(make_copies()[0], calls=1)])
    text = render(trace)
    assert '<dd class="peak">not known</dd>' in text
    assert ('<dd class="per-step">none repeats<small>setup and one-off: 1 calls, 2 ms</small>'
            in text)


# ----- the timeline -----

def _arrows(page: Page, cls: str = "sync") -> list[dict[str, str]]:
    return page.find("g", f"arrow {cls}")


def test_the_step_drawn_and_its_figures_in_the_caption():
    page = Page(render(timeline_trace()))
    svg = page.find("svg", "timeline")[0]
    assert (svg["data-t0-ns"], svg["data-t1-ns"]) == (str(STEP_NS), str(2 * STEP_NS))
    caption = [t for tag, a, t in page.texts if tag == "figcaption"][0]
    assert caption.startswith("Step 2 of the 3 whole steps in the timeline (each begun by "
                              "aten::mm at model.py:20): 100 µs: the host waits 56 µs (56%), "
                              "the device is idle 40 µs (40%); 2 sync copies (#1, #2 in the "
                              "table).")


def before_step(text: str) -> str:
    """The page's first picture: the step as recorded."""
    start = text.index("<svg")
    return text[start:text.index("</svg>", start)]


def test_each_sync_copy_is_an_arrow_at_its_time_linked_to_its_row():
    text = before_step(render(timeline_trace()))
    page = Page(text)
    svg = page.find("svg", "timeline")[0]
    t0, t1 = int(svg["data-t0-ns"]), int(svg["data-t1-ns"])
    x0, x1 = float(svg["data-x0"]), float(svg["data-x1"])
    arrows = [a for a in _arrows(page) if a["data-event"] in {"7", "9"}]
    # step 2's copies: events 7 (HtoD `to`, on the device at 150 us) and 9 (`item`, 180 us)
    assert [(a["data-ref"], a["data-t-ns"]) for a in arrows] == [("0", "150000"),
                                                                 ("1", "180000")]
    lines = [a for t, a in page.elements if t == "line" and a.get("x1") == a.get("x2")
             and "y1" in a and a.get("marker-end", "").endswith("head-sync)")]
    xs = sorted(float(a["x1"]) for a in lines)
    expected = [x0 + (t - t0) * (x1 - x0) / (t1 - t0) for t in (150_000, 180_000)]
    assert xs[:2] == pytest.approx(expected, abs=0.01)
    assert 'href="#sync-1"' in text and 'href="#sync-2"' in text
    labels = page.text("text", "label")
    assert labels[:2] == ["#1 train.py:42", "#2 train.py:50"]


def test_host_waits_and_device_idle_are_shaded():
    page = Page(render(timeline_trace()))
    assert len(page.find("g", "blocked")) >= 2  # the two sync copies' host spans
    idle = page.find("rect", "idle")
    # device idle in step 2: 100-110, 155-170, 185-200 us
    widths = [float(a["width"]) for a in idle]
    svg = page.find("svg", "timeline")[0]
    scale = (float(svg["data-x1"]) - float(svg["data-x0"])) / STEP_NS
    assert widths[:3] == pytest.approx([10_000 * scale, 15_000 * scale, 15_000 * scale],
                                       abs=0.1)


def test_narrow_spans_are_folded_into_one():
    trace = timeline_trace()
    # forty 50 ns adds 100 ns apart at the end of step 2, on the host: each far below a
    # pixel, where the host does nothing else
    base = STEP_NS + 91_000
    tiny = [TimelineEvent("op", 1, None, None, base + 100 * k, base + 100 * k + 50, None, None)
            for k in range(40)]
    events = trace.timeline.events
    events[10:10] = tiny
    page = Page(before_step(render(trace)))
    folded = page.find("g", "folded")
    assert [a["data-folded"] for a in folded] == ["40"]


def test_the_step_picked_and_the_whole_window_where_nothing_repeats():
    win = pick_step(timeline_trace())
    assert (win.first, win.end, win.start_ns, win.end_ns) == (5, 10, STEP_NS, 2 * STEP_NS)
    assert (win.number, win.complete, win.marker) == (2, 3, ("op", 0))
    # every record made once: no step, the timeline's whole span
    once = timeline_trace(ops=[dataclasses.replace(o, calls=1) for o in make_trace().ops],
                          copies=[dataclasses.replace(c, calls=1) for c in make_copies()])
    win = pick_step(once)
    assert (win.first, win.end, win.start_ns, win.end_ns) == (0, 20, 0, 3 * STEP_NS + 90_000)
    assert (win.number, win.marker) == (0, None)
    assert "The timeline's events (no record repeats once a step)" in render(once)


def test_the_replay_gives_each_events_spans_with_the_edits_made():
    trace = timeline_trace()
    replay = Replay(trace)
    assert sorted(replay.spans([])) == list(range(20))
    edit = Suggestion("r", "t", "d", [], [trace.copies[1]], 1)
    spans = replay.spans([edit])
    assert sorted(spans) == [i for i in range(20) if i % 5 != 4]  # the `item` copies gone
    # the first step as recorded up to the copy: mm, add, then the HtoD copy waited for
    assert spans[0] == (0, 10_000, 10_000, 40_000)
    assert spans[2][1] == spans[2][3] + 5_000  # the host goes on 5 us after the transfer


def test_a_trace_without_timeline_says_so():
    assert "No timeline in this trace" in render(make_trace())


def test_the_step_after_the_suggested_edits(monkeypatch):
    trace = timeline_trace()
    edit = Suggestion("accumulate-on-device", "keep the item on the device", "detail",
                      [trace.copies[1].site], [trace.copies[1]], 1_000_000)
    monkeypatch.setattr(html_module, "suggest", lambda *a, **k: [edit])
    page = Page(render(trace))
    before, after = page.find("svg", "timeline")
    # the `item` copy gone, the host no longer waits 18 us in it: the step is shorter
    assert int(after["data-t1-ns"]) - int(after["data-t0-ns"]) < STEP_NS
    assert float(after["data-x1"]) < float(before["data-x1"])
    svg_arrows = [a["data-ref"] for a in page.find("g", "arrow")]
    assert svg_arrows.count("1") == 1  # in the step before, none after


def test_no_step_after_without_suggestions(monkeypatch):
    monkeypatch.setattr(html_module, "suggest", lambda *a, **k: [])
    text = render(timeline_trace())
    assert "No suggested edits, so no step after them." in text
    assert len(Page(text).find("svg", "timeline")) == 1


# ----- the sync copies table -----

def test_one_row_per_sync_copy_path_with_line_chain_and_stack(tmp_path):
    train = tmp_path / "train.py"
    train.write_text("import torch\n" * 41 + "x = batch.to('cuda')\n")
    site = Site(str(train), 42, "train_step")
    copies = make_copies()
    copies[0] = dataclasses.replace(copies[0], site=site, stack=[site])
    page_text = render_html([make_trace(copies=copies)], ["t.json"], cwd=str(tmp_path))
    page = Page(page_text)
    rows = [a["id"] for a in page.find("tr") if a.get("id", "").startswith("sync-")]
    assert rows == ["sync-1", "sync-2"]  # the two sync paths, costliest first; not the async
    assert "<code class=\"src\">x = batch.to(&#x27;cuda&#x27;)</code>" in page_text
    assert page_text.count("<details><summary>1 frame</summary>") == 1
    chain = page.text("ol", "chain")[0]
    assert chain.startswith("aten::arange [cpu] /work/proj/data.py:10")
    assert "HtoD to train.py:42" in chain and chain.endswith("aten::mm [cuda:0] "
                                                             "/work/proj/model.py:20")


def test_a_trace_too_large_lists_the_heaviest_paths_and_says_how_many_it_left_out():
    base = make_copies()[1]
    copies = [dataclasses.replace(base, host_ns=1_000 * (k + 1),
                                  site=Site("/work/proj/train.py", 100 + k, "f"),
                                  stack=[]) for k in range(HTML_SYNC_PATHS + 3)]
    page_text = render(make_trace(copies=copies))
    rows = [a for a in Page(page_text).find("tr") if a.get("id", "").startswith("sync-")]
    assert len(rows) == HTML_SYNC_PATHS
    left = Page(page_text).text("p", "left-out")
    assert left[0].startswith("3 more sync copy paths left out (30 calls, ")
    assert f"this page shows the heaviest {HTML_SYNC_PATHS}" in left[0]
    # the heaviest first: the last three made (the cheapest) are the ones left out
    assert "train.py:100<" not in page_text and f"train.py:{99 + HTML_SYNC_PATHS + 3}<" in page_text


# ----- suggestions -----

def test_suggestions_with_coloured_diffs_and_measured_savings(monkeypatch):
    from memcpy_doctor.run.verify import Verified

    trace = make_trace()
    diff = ("--- a/train.py\n+++ b/train.py\n@@ -42,1 +42,1 @@\n ctx\n"
            "-x = batch.to('cuda')\n+x = batch.to('cuda', non_blocking=True)\n")
    edit = Suggestion("pinned-non-blocking", "pin the batch", "why", [trace.copies[0].site],
                      [trace.copies[0]], 1_500_000, diff=diff, estimate=REPLAYED,
                      verified=Verified((20, 0), (10_000_000, 8_500_000)))
    monkeypatch.setattr(html_module, "suggest", lambda *a, **k: [edit])
    text = render(trace)
    page = Page(text)
    assert page.text("span", "file") == ["--- a/train.py", "+++ b/train.py"]
    assert page.text("span", "hunk") == ["@@ -42,1 +42,1 @@"]
    assert page.text("span", "del") == ["-x = batch.to('cuda')"]
    assert page.text("span", "add") == ["+x = batch.to('cuda', non_blocking=True)"]
    assert page.text("span", "ctx") == [" ctx"]
    assert page.text("p", "saving") == ["saves ~1.5 ms (estimated by replaying the run's "
                                        "timeline with the edit)"]
    assert page.text("p", "verified") == ["Measured: verified by a re-run with the edit: sync "
                                          "calls 20 -> 0, saves 1.5 ms (total 10 ms -> 8.5 ms)"]


def test_the_diff_lines_are_classed_by_their_mark():
    assert diff_html("+a\n-b\n c\n@@ x @@\n") == (
        '<pre class="diff"><code><span class="add">+a</span><span class="del">-b</span>'
        '<span class="ctx"> c</span><span class="hunk">@@ x @@</span></code></pre>')


def test_no_suggestions_says_so():
    text = render(make_trace(ops=[], copies=[c for c in make_copies() if not c.sync]))
    assert '<p class="none">No suggestions' in text
    assert '<p class="none">No copies the host waited for.</p>' in text


# ----- self-contained, escaped -----

_URL = re.compile(r"https?:|//|<link|\bsrc=|@import|url\((?!#)", re.IGNORECASE)


def test_the_page_refers_to_nothing_outside_itself():
    for trace in (timeline_trace(), make_trace(light=True)):
        text = render(trace)
        assert not _URL.findall(text)
        page = Page(text)
        assert all(a["href"].startswith("#") for t, a in page.elements if "href" in a)
        ids = [a["id"] for t, a in page.elements if "id" in a]
        assert len(ids) == len(set(ids))
        targets = {a["href"][1:] for t, a in page.elements if "href" in a}
        assert targets <= set(ids)


def test_a_hostile_file_and_op_name_are_escaped():
    evil = '/work/proj/<script>alert("x")</script>.py'
    copies = make_copies()
    site = Site(evil, 42, "<img onerror=alert(1)>")
    copies[0] = dataclasses.replace(copies[0], site=site, stack=[site])
    trace = timeline_trace(copies=copies)
    trace.ops[0].op = "aten::<b>mm</b>"
    text = render_html([trace], ['<evil name="x">.json'], cwd=PROJECT_DIR)
    assert "<script" not in text and "<img" not in text and "<b>" not in text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;.py:42" in text
    assert "&lt;evil name=&quot;x&quot;&gt;.json" in text
    assert "aten::&lt;b&gt;mm&lt;/b&gt;" in text


# ----- light, imported, ranks -----

def test_a_light_trace_has_no_timeline_of_ops():
    trace = make_trace(light=True, ops=[])
    trace.timeline = EventTimeline(10_000, 0, [TimelineEvent("copy", 1, None, None, 10, 10,
                                                             None, None)])
    page = Page(render(trace))
    assert page.text("p", "no-timeline") == [
        "Light mode records no ops, so there is no timeline of a step: the table below has "
        "every sync it counted."]
    assert page.find("svg") == []
    assert [t for tag, a, t in page.texts if tag == "dt"][0] == "Wall time"


def test_an_imported_trace_shows_the_gpu_idle_and_says_it_has_no_timeline():
    copies = [dataclasses.replace(c, idle_ns=250_000 if c.sync else None)
              for c in make_copies()]
    trace = make_trace(copies=copies, simulated=False, device="cuda",
                       imported_from="/traces/a100.json.gz")
    text = render(trace)
    page = Page(text)
    assert page.text("p", "no-timeline") == [
        "No timeline: a trace imported from torch.profiler keeps no events in order here; "
        "the table below has every sync copy path."]
    assert "<th scope=\"col\">GPU idle after</th>" in text
    assert "Total time (the trace's span)" in text


def test_several_ranks_get_a_section_each():
    traces = [timeline_trace(rank=r, world_size=2) for r in (0, 1)]
    text = render_html(traces, ["t.rank0.json", "t.rank1.json"], cwd=PROJECT_DIR)
    page = Page(text)
    assert [a["id"] for a in page.find("section", "trace")] == ["r0-", "r1-"]
    assert [t for tag, a, t in page.texts if tag == "h2"] == ["Rank 0: t.rank0.json",
                                                             "Rank 1: t.rank1.json"]
    assert len(page.find("figure", "step before")) == 2
    rows = [a["id"] for a in page.find("tr") if "sync-" in a.get("id", "")]
    assert rows == ["r0-sync-1", "r0-sync-2", "r1-sync-1", "r1-sync-2"]
    assert not _URL.findall(text)


def test_traces_and_names_must_pair():
    with pytest.raises(ValueError):
        render_html([make_trace()], [])


# ----- a profiled sample -----

@pytest.fixture(scope="module")
def sample_page(tmp_path_factory):
    """The page of shape_slice_crop.py profiled on the simulated GPU through the Python
    API, written to a file; and the trace."""
    import runpy

    import memcpy_doctor

    namespace = runpy.run_path(str(SAMPLE))
    with memcpy_doctor.profiler(device="sim") as prof:
        namespace["main"](["--iters", "10"])
    trace = prof.trace
    path = tmp_path_factory.mktemp("html") / "report.html"
    path.write_text(render_html([trace], ["shape_slice_crop"], cwd=str(REPO)),
                    encoding="utf-8")
    return path, trace


def test_the_samples_sync_arrows_sit_at_their_copies_times(sample_page):
    path, trace = sample_page
    page = Page(path.read_text(encoding="utf-8"))
    svg = page.find("svg", "timeline")[0]
    arrows = _arrows(page)
    assert {a["data-ref"] for a in arrows} == {str(i) for i, c in enumerate(trace.copies)
                                               if c.sync}
    t0, t1 = int(svg["data-t0-ns"]), int(svg["data-t1-ns"])
    for a in arrows:
        event = trace.timeline.events[int(a["data-event"])]
        assert (event.kind, event.ref) == ("copy", int(a["data-ref"]))
        assert int(a["data-t-ns"]) == event.device_start_ns
        assert t0 <= event.device_start_ns <= t1


# ----- in a browser -----

def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))
                 if p), None)


#: Headless, and nothing from the network: every host name resolves to nothing, and the
#: browser's own background requests (updates, sync) are off.
_QUIET = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
          "--host-resolver-rules=MAP * ~NOTFOUND", "--disable-background-networking",
          "--disable-component-update", "--disable-sync", "--no-first-run",
          "--disable-default-apps", "--disable-extensions", "--virtual-time-budget=3000"]


def _browse(browser: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([browser, *_QUIET, f"--user-data-dir={tmp / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120)


def _page_requests(browser: str, tmp: Path, url: str, *args: str) -> list[str]:
    """The URLs the browser asked for on the page's behalf while loading `url`, from its
    net log (the browser's own requests, such as update checks, have no origin)."""
    net = tmp / "net.json"
    _browse(browser, tmp, f"--log-net-log={net}", *args, url)
    log = json.loads(net.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [e["params"]["url"] for e in log["events"] if e["type"] == start
            and e.get("params", {}).get("initiator", "not an origin") != "not an origin"]


def _pixels(png: bytes, rows: int) -> list[bytes]:
    """The first `rows` rows of an 8-bit RGB or RGBA PNG, unfiltered: a row is its pixels'
    bytes."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, bpp = 8, b"", 0, 0, 0
    while pos < len(png):
        n, kind = struct.unpack(">I4s", png[pos:pos + 8])
        body = png[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6)
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    out = []
    for y in range(min(rows, height)):
        at = y * (stride + 1)
        kind, line = raw[at], bytearray(raw[at + 1:at + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out.append(bytes(line))
        prev = line
    return [bytes(r[i:i + bpp]) for r in out for i in range(0, len(r), bpp)]


_MEASURE = """<script>
addEventListener("load", () => {
  const out = [];
  for (const svg of document.querySelectorAll("svg.timeline")) {
    const axis = svg.querySelector("line.axis").getBoundingClientRect();
    for (const g of svg.querySelectorAll("g.arrow.sync")) {
      const r = g.querySelector("line").getBoundingClientRect();
      out.push({svg: svg.id, t: +g.dataset.tNs, x: r.left + r.width / 2, left: axis.left,
                right: axis.right, t0: +svg.dataset.t0Ns, t1: +svg.dataset.t1Ns});
    }
  }
  const pre = document.createElement("pre");
  pre.id = "measured";
  pre.textContent = JSON.stringify(out);
  document.body.append(pre);
});
</script>"""


@pytest.mark.skipif(_chromium() is None, reason="no Chromium installed (.ci/run installs "
                    "Debian's chromium)")
def test_the_page_in_a_headless_browser(sample_page, tmp_path):
    browser = _chromium()
    path, trace = sample_page
    url = path.as_uri()
    # a screenshot at 1280 px that is not blank, and nothing requested on the page's behalf
    shot = tmp_path / "shot.png"
    assert _page_requests(browser, tmp_path, url, f"--screenshot={shot}",
                          "--window-size=1280,2000") == []
    colours = Counter(_pixels(shot.read_bytes(), rows=500))
    assert len(colours) > 20
    assert colours.most_common(1)[0][1] < 0.98 * colours.total()
    # (the check sees a page's request: an image from elsewhere, which resolves to nothing)
    control = tmp_path / "control.html"
    control.write_text('<p>x<img src="http://memcpy-doctor.invalid/x.png" alt=""></p>')
    assert _page_requests(browser, tmp_path, control.as_uri()) == [
        "http://memcpy-doctor.invalid/x.png"]
    # where the browser draws each sync arrow: at its copy's time on the axis's scale
    measured = tmp_path / "measured.html"
    measured.write_text(path.read_text(encoding="utf-8").replace("</body>", _MEASURE
                                                                 + "</body>"))
    dom = _browse(browser, tmp_path, "--window-size=1280,2000", "--dump-dom",
                  measured.as_uri()).stdout
    found = json.loads(re.search(r'<pre id="measured">(.*?)</pre>', dom).group(1))
    assert len(found) == sum(1 for c in trace.copies if c.sync)
    for m in found:
        px_ns = (m["t1"] - m["t0"]) / (m["right"] - m["left"])
        assert m["t0"] + (m["x"] - m["left"]) * px_ns == pytest.approx(m["t"], abs=px_ns)
    # the DOM as loaded: no element refers to anything outside the page
    plain = _browse(browser, tmp_path, "--dump-dom", url).stdout
    assert not re.findall(r'\b(?:src|href)="(?!#)', plain) and "<link" not in plain
    assert os.path.getsize(shot) > 10_000
