"""The four sample_models scripts, profiled on the simulated GPU as a user would.

For each: `python sample_models/X.py` and
`python -m memcpy_doctor profile --device sim -o T.json sample_models/X.py` (cwd: the repository
root) print the same thing, and the trace holds the copies the script's docstring promises.
Line numbers are found by searching the script's source, never hard-coded.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import concurrently
from memcpy_doctor import load_trace
from memcpy_doctor.core.trace import CopyRecord, Trace

TIMEOUT = 120
REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_models"
NAMES = ["shape_slice_crop.py", "item_every_step.py", "clean_pinned.py", "embedding_l2.py"]


#: Hide any real GPU: the plain run then computes on the host, as the simulated GPU does, so
#: the printed losses agree to the last digit on a CUDA machine too.
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def run(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], cwd=REPO, capture_output=True,
                          timeout=TIMEOUT, env=ENV)


@dataclass
class SampleRun:
    path: Path  # absolute path of the sample, as sites name it
    plain: subprocess.CompletedProcess
    prof: subprocess.CompletedProcess
    trace: Trace

    def line(self, snippet: str) -> int:
        """The line of the one code line of the sample (after its docstring) that contains
        `snippet`."""
        source = self.path.read_text()
        body = ast.parse(source).body
        doc_end = body[0].end_lineno if isinstance(body[0], ast.Expr) else 0
        hits = [i for i, text in enumerate(source.splitlines(), 1)
                if i > doc_end and snippet in text]
        assert len(hits) == 1, f"{snippet!r} is on lines {hits} of {self.path}"
        return hits[0]

    def copies(self, *, direction: str | None = None, sync: bool | None = None,
               line: int | None = None) -> list[CopyRecord]:
        return [c for c in self.trace.copies
                if (direction is None or c.direction == direction)
                and (sync is None or c.sync == sync)
                and (line is None or (c.site is not None and c.site.line == line))]


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """sample(name): run it plainly and profiled (side by side), once per module."""
    cache: dict[str, SampleRun] = {}
    out_dir = tmp_path_factory.mktemp("samples")

    def get(name: str) -> SampleRun:
        if name not in cache:
            script = f"sample_models/{name}"
            trace_path = out_dir / f"{name}.trace.json"
            plain, prof = concurrently(
                lambda: run(script),
                lambda: run("-m", "memcpy_doctor", "profile", "--device", "sim", "-o",
                            trace_path, script))
            assert plain.returncode == 0, plain.stderr.decode()
            assert prof.returncode == 0, prof.stderr.decode()
            trace = load_trace(trace_path)
            cache[name] = SampleRun(SAMPLES / name, plain, prof, trace)
            for c in trace.copies:  # every copy is made by the sample itself
                assert c.site is not None and c.site.file == str(SAMPLES / name), c
        return cache[name]

    return get


@pytest.mark.parametrize("name", NAMES)
def test_profiled_run_prints_what_the_plain_run_prints(sample, name):
    s = sample(name)
    assert s.prof.stdout == s.plain.stdout
    assert s.plain.stdout.strip(), "the sample printed nothing"
    err = s.prof.stderr.decode()
    for heading in ("Profiling Report", "GpuMemCpy Summary", "Event Summary"):
        assert heading in err
    meta = s.trace.meta
    assert meta.simulated is True
    assert meta.device == "sim"
    assert (meta.exit_status, meta.ended_by) == (0, "completed")


def test_shape_slice_crop(sample):
    s = sample("shape_slice_crop.py")
    slice_line = s.line("return torch.narrow_copy(shape, 0, start, end - start)")
    tolist_line = s.line("sizes = shape.tolist()")
    fetch_line = s.line('result = out.to("cpu", non_blocking=True)')
    sync_line = s.line("torch.cuda.synchronize()")

    summary = s.trace.summary
    assert (summary.memcpy_all.calls, summary.memcpy_async.calls,
            summary.memcpy_sync.calls) == (30, 10, 20)

    sync = s.copies(sync=True)
    assert len(sync) == 2, sync
    [htod] = [c for c in sync if c.direction == "HtoD"]
    [dtoh] = [c for c in sync if c.direction == "DtoH"]

    # the guard copies the host shape to the device for the slice, at the slice's line
    assert htod.site.line == slice_line
    assert (htod.trigger, htod.calls, htod.bytes) == ("to", 10, 320)
    # (its consumer: test_shape_slice_crop_htod_consumer_is_the_slice below)

    assert dtoh.site.line == tolist_line
    assert (dtoh.trigger, dtoh.calls) == ("tolist", 10)
    assert dtoh.producer is not None
    assert dtoh.producer.op == "aten::narrow_copy"
    assert dtoh.producer.site.line == slice_line

    # the fetch: asynchronous, into pinned memory, at one site. (The trace splits it into two
    # records because a path's key includes its consumer: the last result is read by
    # `result.sum()`, the nine before it by nothing.)
    asynchronous = s.copies(sync=False)
    assert {(c.direction, c.site.line, c.trigger, c.pinned) for c in asynchronous} == {
        ("DtoH", fetch_line, "to", True)}
    assert sum(c.calls for c in asynchronous) == 10

    waits = [w for w in s.trace.waits if w.kind == "synchronize"]
    assert sum(w.calls for w in waits) == 10
    assert {w.site.line for w in waits} == {sync_line}


def test_shape_slice_crop_htod_consumer_is_the_slice(sample):
    s = sample("shape_slice_crop.py")
    [htod] = s.copies(direction="HtoD", sync=True)
    slice_line = s.line("return torch.narrow_copy(shape, 0, start, end - start)")
    assert htod.consumer is not None
    assert htod.consumer.op == "aten::narrow_copy"
    assert htod.consumer.device == "cuda:0"
    assert htod.consumer.site.line == slice_line
    assert htod.producer.site.line == s.line('return torch.tensor(x.shape, device="cpu")')


def test_item_every_step(sample):
    s = sample("item_every_step.py")
    item_line = s.line("total += loss.item()")
    dtoh = s.copies(direction="DtoH")
    assert dtoh and all(c.sync for c in dtoh)
    assert {(c.site.line, c.trigger) for c in dtoh} == {(item_line, "item")}
    assert sum(c.calls for c in dtoh) == 20
    assert {c.producer.op for c in dtoh} == {"aten::nll_loss_forward"}

    for snippet in ("x = x_host.to(device)", "y = y_host.to(device)"):
        at = s.copies(line=s.line(snippet))
        assert at and all(c.direction == "HtoD" and c.sync for c in at), at
        assert sum(c.calls for c in at) == 20, snippet

    assert s.trace.summary.memcpy_async.calls == 0


def test_clean_pinned(sample):
    s = sample("clean_pinned.py")
    model_line = s.line("model = make_model().to(device)")
    item_line = s.line("total.item()")
    loop_start = s.line("for x_host, y_host in zip(xs_host, ys_host):")
    loop_end = s.line("total += loss.detach()")

    sync = s.copies(sync=True)
    assert not [c for c in sync if loop_start <= c.site.line <= loop_end], \
        "a synchronous copy inside the training loop"
    assert {(c.direction, c.site.line) for c in sync} == {("HtoD", model_line),
                                                          ("DtoH", item_line)}
    # the model's weights and biases: 2 Linear layers, 4 parameters
    assert sum(c.calls for c in sync if c.direction == "HtoD") == 4
    [item] = [c for c in sync if c.direction == "DtoH"]
    assert (item.trigger, item.calls, item.bytes) == ("item", 1, 4)

    for snippet in ("x = x_host.to(device, non_blocking=True)",
                    "y = y_host.to(device, non_blocking=True)"):
        at = s.copies(line=s.line(snippet))
        assert at and all(c.direction == "HtoD" and not c.sync and c.pinned is True
                          for c in at), at
        assert sum(c.calls for c in at) == 20, snippet

    summary = s.trace.summary
    assert (summary.memcpy_all.calls, summary.memcpy_async.calls,
            summary.memcpy_sync.calls) == (45, 40, 5)


def test_embedding_l2(sample):
    s = sample("embedding_l2.py")
    m = re.search(r'"--vocab", type=int, default=([0-9_]+)', s.path.read_text())
    assert m, "cannot find the default --vocab in the sample"
    vocab = int(m.group(1))

    dtoh = s.copies(direction="DtoH")
    assert len(dtoh) == 1, dtoh
    [loss] = dtoh
    assert loss.sync
    assert loss.site.line == s.line("loss.item()")
    assert (loss.trigger, loss.calls, loss.bytes) == ("item", 1, 4)

    htod = s.copies(direction="HtoD")
    model_line = s.line("model = Net(args.vocab).to(device)")
    assert {c.site.line for c in htod} == {model_line}
    assert all(c.sync for c in htod)
    assert sum(c.calls for c in htod) == 1  # one parameter: the embedding weight
    assert sum(c.bytes for c in htod) == vocab * 150 * 4

    assert not s.copies(direction="DtoD")
    assert s.trace.summary.memcpy_all.calls == 2


def test_samples_run_with_device_cpu():
    """`python X.py --device cpu` for all four, in one interpreter (each seeds torch itself)."""
    code = ("import runpy, sys\n"
            "for path in sys.argv[1:]:\n"
            "    sys.argv = [path, '--device', 'cpu']\n"
            "    runpy.run_path(path, run_name='__main__')\n")
    r = run("-c", code, *(f"sample_models/{n}" for n in NAMES))
    assert r.returncode == 0, r.stderr.decode()
    lines = r.stdout.decode().splitlines()
    assert [line.split(":")[0] for line in lines] == ["crop sum", "mean loss", "mean loss",
                                                      "final loss"]
    # the two training loops use the same data and seed: the same mean loss
    assert lines[1] == lines[2]
    assert lines[0] == "crop sum: 37.5000"


def test_shape_slice_crop_explain_apply_diff(sample, tmp_path):
    """The article's workflow: explain names the slice, its device_guard edit is the top
    suggestion, applying it removes both sync copies, and diff shows it."""
    import json

    s = sample("shape_slice_crop.py")
    before = tmp_path / "before.json"
    before.write_text(s.trace.to_json())
    explained = run("-m", "memcpy_doctor", "explain", "--format", "json", before)
    assert explained.returncode == 0, explained.stderr.decode()
    data = json.loads(explained.stdout)
    chain = data["chains"][0]
    slice_line = s.line("return torch.narrow_copy(shape, 0, start, end - start)")
    assert [c["direction"] for c in chain["copies"]] == ["HtoD", "DtoH"]
    assert chain["producer"]["site"]["line"] == s.line('return torch.tensor(x.shape, device="cpu")')
    assert [b["site"]["line"] for b in chain["between"]] == [slice_line]
    top = data["suggestions"][0]
    assert top["rule"] == "host-round-trip"
    assert top["apply"]["sites"] == [{"file": str(s.path), "line": slice_line}]
    assert '+    with memcpy_doctor.device_guard("cpu"):' in top["diff"]

    suggestions = tmp_path / "s.json"
    suggestions.write_bytes(explained.stdout)
    after = tmp_path / "after.json"
    applied = run("-m", "memcpy_doctor", "profile", "--device", "sim", "--apply", suggestions,
                  "-o", after, "sample_models/shape_slice_crop.py")
    assert applied.returncode == 0, applied.stderr.decode()
    assert applied.stdout == s.plain.stdout
    fixed = load_trace(after)
    assert (fixed.summary.memcpy_sync.calls, fixed.summary.memcpy_async.calls) == (0, 10)

    compared = run("-m", "memcpy_doctor", "diff", before, after)
    assert compared.returncode == 0
    assert re.search(r"GpuMemcpySync\s.*-100\.0%\s+20 -> 0", compared.stdout.decode())
