"""profile --chrome-trace: the timeline loads as Chrome trace JSON with host and device tracks,
the copies and waits, and flows producer -> copy -> consumer."""

from __future__ import annotations

import json

import torch

from memcpy_doctor.render.chrome import DEVICE, HOST, render_chrome
from memcpy_doctor.tracer import Tracer


def test_timeline_has_tracks_copies_waits_and_flows():
    tracer = Tracer(device="sim", chrome_events=1000)
    with tracer:
        h = torch.arange(4.0)                 # producer on the host
        d = h.to("cuda")                      # HtoD
        s = (d * 2).sum()                     # consumer of the copy, on the device
        torch.cuda.synchronize()
        s.item()                              # DtoH
    data = json.loads(render_chrome(tracer.chrome, "GPU", True))
    events = data["traceEvents"]
    x = [e for e in events if e["ph"] == "X"]
    names = [(e["pid"], e["name"]) for e in x]
    assert (HOST, "aten::arange") in names and (DEVICE, "aten::mul") in names
    assert (HOST, "GpuMemcpySync:CPU->GPU") in names and (DEVICE, "GpuMemcpySync:CPU->GPU") in names
    assert (HOST, "HostWait:synchronize") in names
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in x)
    host = [e for e in x if e["pid"] == HOST]
    assert [e["ts"] for e in host] == sorted(e["ts"] for e in host)  # program order
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == ends.keys() and len(starts) >= 2
    assert all(ends[i]["ts"] >= starts[i]["ts"] for i in starts)
    assert data["otherData"]["simulated"] is True
    processes = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert processes == {"host", "GPU (simulated)"}


def test_timeline_is_capped():
    tracer = Tracer(device="sim", chrome_events=5)
    with tracer:
        x = torch.ones(2, device="cuda")
        for _ in range(20):
            x = x + 1
    assert len(tracer.chrome.events) == 5 and tracer.chrome.dropped > 0
