"""explain on torch.profiler traces without Python stacks (issue 43): advice that needs no line
(pinning, non_blocking), with no diff and a saving from the trace's own figures, and never a
bare "No suggestions.": the reason, in text, Markdown and JSON. Hand-written traces in
Kineto's format with round times (us), and the CLI on ../shared/kineto/a100_alexnet.json.gz."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memcpy_doctor.analysis.attribution import explain
from memcpy_doctor.analysis.rules import suggest
from memcpy_doctor.core.timeline import EventTimeline, TimelineEvent
from memcpy_doctor.kineto.reader import from_kineto
from memcpy_doctor.render.explain import render_explain

SHARED = Path(__file__).resolve().parents[2] / "shared" / "kineto"
NO_DIFF = ("the profile has no Python stacks (record it with torch.profiler.profile(..., "
           "with_stack=True) to get this edit at its line)")


def _x(cat: str, name: str, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": args}


def _gpu(cat: str, name: str, ts: float, dur: float, corr: int, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, **args}}


def _upload(t: float, corr: int, kind: str, nbytes: int, call: float, wait: float | None,
            op: str = "aten::to") -> list[dict]:
    """One host->device copy at `t` inside `op`: its cudaMemcpyAsync call of `call` us, then
    (unless `wait` is None) a stream sync of `wait` us in the same op, PyTorch's
    memcpy_and_sync."""
    events = [_x("cpu_op", op, t, 900), _x("cpu_op", "aten::copy_", t + 1, 898),
              _x("cuda_runtime", "cudaMemcpyAsync", t + 10, call, correlation=corr),
              _gpu("gpu_memcpy", f"Memcpy HtoD ({kind} -> Device)", t + 10, 5, corr,
                   bytes=nbytes)]
    if wait is not None:
        events.append(_x("cuda_runtime", "cudaStreamSynchronize", t + 10 + call, wait))
    return events


def steps_trace(steps: int = 4, async_pinned: bool = True, items: bool = False) -> dict:
    """`steps` steps 10 ms apart, each: a 1 MiB upload of pageable memory (100 us call, 400 us
    wait), a 4 KiB one by copy_ (20 + 30 us), a 64 KiB one of pinned memory waited
    for (10 + 90 us), an asynchronous 1 KiB one of pinned memory (5 us; not with
    `async_pinned=False`), a matmul, and with `items` a loss.item() (10 + 40 us)."""
    events, corr = [], 0
    for step in range(steps):
        t = step * 10_000
        events += _upload(t, corr + 1, "Pageable", 1 << 20, 100, 400)
        events += _upload(t + 1_000, corr + 2, "Pageable", 4096, 20, 30, "aten::copy_")
        events += _upload(t + 2_000, corr + 3, "Pinned", 1 << 16, 10, 90)
        if async_pinned:
            events += _upload(t + 3_000, corr + 4, "Pinned", 1024, 5, None, "aten::copy_")
        events += [_x("cpu_op", "aten::mm", t + 4_000, 20),
                   _x("cuda_runtime", "cudaLaunchKernel", t + 4_005, 5, correlation=corr + 5),
                   _gpu("kernel", "gemm", t + 4_010, 3_000, corr + 5)]
        if items:
            events += [_x("cpu_op", "aten::item", t + 8_000, 100),
                       _x("cpu_op", "aten::_local_scalar_dense", t + 8_001, 98),
                       _x("cuda_runtime", "cudaMemcpyAsync", t + 8_010, 10,
                          correlation=corr + 6),
                       _gpu("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", t + 8_010, 2,
                            corr + 6, bytes=4),
                       _x("cuda_runtime", "cudaStreamSynchronize", t + 8_020, 40)]
        corr += 6
    return {"deviceProperties": [{"name": "NVIDIA A100-SXM4-80GB"}], "traceEvents": events}


def _explained(data: dict):
    trace = from_kineto(data, "k.json")
    exp = explain(trace)
    aside: list = []
    return trace, exp, suggest(trace, exp, not_worth_it=aside), aside


def test_uploads_waited_for_every_step_get_advice_without_a_diff_priced_from_the_trace():
    """Pageable uploads of batch size: the DataLoader pins; smaller ones: pin the source;
    pinned ones: non_blocking. Each saves the host's time in its copies less what the trace's
    own asynchronous pinned uploads took a call (5 us), no diff, and says why."""
    trace, exp, found, aside = _explained(steps_trace())
    assert [(s.title, s.saving_ns, s.estimate, s.effect, s.exact) for s in found] == [
        ("pin the batches with DataLoader(pin_memory=True) and copy them with "
         "non_blocking=True (`aten::to`, 4 calls of 1 MiB each on average, every step)",
         4 * 500_000 - 4 * 5_000, "upper bound (no timeline in this trace)", "async", False),
        ("copy the uploads of pinned memory with non_blocking=True (`aten::to`, 4 calls of "
         "64 KiB each on average, every step)",
         4 * 100_000 - 4 * 5_000, "upper bound (no timeline in this trace)", "async", False),
        ("pin the uploads' host memory and copy with non_blocking=True (`aten::copy_`, 4 "
         "calls of 4 KiB each on average, every step)",
         4 * 50_000 - 4 * 5_000, "upper bound (no timeline in this trace)", "async", False)]
    for s in found:
        assert (s.rule, s.diff, s.apply, s.sites, s.no_diff) == (
            "pinned-non-blocking", None, None, [], NO_DIFF)
        assert [(c.calls, c.pinned) for c in s.removes] == [(4, s.removes[0].pinned)]
    assert "(5 us, what this trace's 4 asynchronous uploads of pinned memory took the host " \
           "each)" in found[0].detail
    assert found[0].detail.startswith(
        "4 host->device copies of 1048576 bytes each from pageable memory, each waited for in "
        "`aten::to` (`x.to(device)`, `x.cuda()`), 2 ms of host time; of their size they look "
        "like a DataLoader's batches: build it with pin_memory=True")
    assert "this trace cannot show whether it does" in found[1].detail  # (a reused buffer)
    assert aside == [] and exp.no_suggestions_reason is None


def test_without_asynchronous_uploads_the_launch_is_the_device_profiles_and_says_so():
    _, _, found, _ = _explained(steps_trace(async_pinned=False))
    assert [s.saving_ns for s in found] == [1_980_000, 380_000, 180_000]  # (5 us: a100's)
    assert ("(5 us, the launch cost of the device profile NVIDIA A100-SXM4-80GB; this trace "
            "times no asynchronous upload)") in found[0].detail


def test_the_text_json_and_markdown_mark_the_advice_as_without_a_diff():
    trace, exp, found, aside = _explained(steps_trace())
    text = render_explain(exp, found, "text", not_worth_it=aside)
    assert f"   no diff: {NO_DIFF}" in text.splitlines()
    assert "   saves ~1.98 ms (estimated, upper bound (no timeline in this trace); removes 1 " \
           "copy path, 4 calls) [heuristic]" in text.splitlines()
    data = json.loads(render_explain(exp, found, "json", not_worth_it=aside))
    assert [s["no_diff_reason"] for s in data["suggestions"]] == [NO_DIFF] * 3
    assert data["no_suggestions_reason"] is None
    assert f"   No diff: {NO_DIFF}." in render_explain(exp, found, "markdown").splitlines()


def test_uploads_made_once_get_the_reason_and_no_advice():
    """A model moved to the device: 16 uploads in one burst of a long run. Pinning them
    would cost the host a copy of its own: no edit, and the line says so."""
    events = []
    for i in range(16):
        events += _upload(1_000 + 1_000 * i, i + 1, "Pageable", 1 << 20, 50, 10)
    events += [_x("cpu_op", "aten::mm", 100_000, 20)]
    trace, exp, found, aside = _explained({"traceEvents": events})
    assert found == [] and aside == []
    reason = ("16 sync copies (HtoD `to`, 1.04 ms): made once or in one burst (setup: a model "
              "or data moved to the device, say), and pinning is proposed only for uploads "
              "made every step, as pinning memory that is copied once costs the host a copy "
              "of its own")
    assert exp.no_suggestions_reason == reason
    assert render_explain(exp, [], "text").splitlines()[-1] == f"No suggestions: {reason}."
    assert json.loads(render_explain(exp, [], "json"))["no_suggestions_reason"] == reason
    assert render_explain(exp, [], "markdown").splitlines()[-1] == f"No suggestions: {reason}."


def test_reads_every_step_without_stacks_need_the_line_and_say_how_to_get_it():
    """loss.item() every step: the edit (read once after the loop) goes at the line, which a
    profile without stacks does not name. The uploads' advice stays."""
    _, exp, found, _ = _explained(steps_trace(items=True))
    assert len(found) == 3
    data = steps_trace(items=True)
    data["traceEvents"] = [e for e in data["traceEvents"] if "HtoD" not in e["name"]]
    _, exp, found, _ = _explained(data)
    assert found == []
    assert exp.no_suggestions_reason == (
        "4 sync copies (DtoH `item`, 0.208 ms): made every step; an edit for them goes at "
        "the line that makes them, which this profile does not name: record it with "
        "torch.profiler.profile(..., with_stack=True) to get edits at lines")


def test_one_read_made_once_is_one_copy_not_them():
    data = steps_trace(steps=1, items=True)
    data["traceEvents"] = [e for e in data["traceEvents"] if "HtoD" not in e["name"]]
    _, exp, found, _ = _explained(data)
    assert exp.no_suggestions_reason == (
        "1 sync copy (DtoH `item`, 0.052 ms): made once or in one burst (setup or teardown), "
        "not every step, where the rules propose no edit")


def test_a_pinned_upload_that_would_race_keeps_its_wait_and_the_reason_says_so():
    """The timeline shows the host writing the upload's pinned memory before anything
    orders the copy (a buffer refilled every step): non_blocking would race."""
    data = steps_trace(async_pinned=False)
    data["traceEvents"] = [e for e in data["traceEvents"] if "Pageable" not in e["name"]
                           and e["cat"] != "kernel"]
    trace = from_kineto(data, "k.json")
    pinned, = trace.copies
    ref = trace.copies.index(pinned)
    assert [s.removes for s in suggest(trace, explain(trace))] == [[pinned]]  # (no timeline)
    trace.timeline = EventTimeline(100, 0, [
        TimelineEvent("copy", ref, None, 7, 0, 100, 10, 60, reads=[1]),
        TimelineEvent("op", 0, None, None, 200, 300, None, None, writes=[1])])
    exp = explain(trace)
    assert suggest(trace, exp) == []
    assert exp.no_suggestions_reason == (
        "4 sync copies (HtoD `to`, 0.42 ms): made non_blocking, they would race: the host "
        "writes their pinned memory again before anything waits for them")


def test_no_sync_copy_is_a_reason_too():
    data = steps_trace()
    data["traceEvents"] = [e for e in data["traceEvents"]
                           if e["name"] != "cudaStreamSynchronize"
                           and "Pageable" not in e["name"]]
    trace, exp, found, _ = _explained(data)
    assert found == [] and exp.no_suggestions_reason == "no copy the host waited for"
    assert render_explain(exp, [], "text").splitlines()[-2:] == [
        "No copies the host waited for.", "No suggestions: no copy the host waited for."]


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/kineto is not here")
def test_the_cli_on_the_alexnet_trace_says_why_it_suggests_nothing():
    """16 pageable uploads, each waited for, in one burst: the model's parameters moved to
    the device once."""
    path = SHARED / "a100_alexnet.json.gz"
    reason = ("16 sync copies (HtoD `to`, 113.1 ms): made once or in one burst (setup: a model "
              "or data moved to the device, say), and pinning is proposed only for uploads "
              "made every step, as pinning memory that is copied once costs the host a copy "
              "of its own")
    r = subprocess.run([sys.executable, "-m", "memcpy_doctor", "explain", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == f"No suggestions: {reason}."
    assert "No suggestions." not in r.stdout.splitlines()
    r = subprocess.run([sys.executable, "-m", "memcpy_doctor", "explain", "--format", "json",
                        str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert (data["suggestions"], data["no_suggestions_reason"]) == ([], reason)
