"""The cost model: two-clock Timeline replay, roofline kernel and copy times, device profiles."""

from __future__ import annotations

import json

import pytest

from memcpy_doctor.core.costmodel import (DeviceProfile, ProfileError, Timeline, available_profiles,
                                          load_profile)
from memcpy_doctor.core.defaults import DEFAULT_DEVICE_PROFILE


def make_profile(**overrides) -> DeviceProfile:
    """A device with round figures: 1 TFLOP/s float32, 1 TB/s memory, 20/10 GB/s PCIe."""
    fields = dict(
        name="Round GPU",
        peak_flops={"float32": 1e12, "float16": 4e12, "other": 5e11},
        memory_bandwidth=1e12,
        copy_bandwidth={"HtoD_pinned": 2e10, "HtoD_pageable": 1e10,
                        "DtoH_pinned": 4e10, "DtoH_pageable": 5e9, "DtoD": 1e11},
        launch_ns=5_000, kernel_min_ns=2_000, copy_setup_ns=1_000, sync_ns=5_000,
        total_memory_bytes=16 * 2**30,
    )
    fields.update(overrides)
    return DeviceProfile(**fields)


# ----- Timeline -----

def clocks(tl: Timeline) -> tuple[int, int]:
    return tl.host_ns, tl.device_ns


def test_timeline_starts_at_zero():
    tl = Timeline()
    assert clocks(tl) == (0, 0)
    assert tl.end_ns() == 0


def test_host_work_moves_only_the_host_clock():
    tl = Timeline()
    assert tl.host(1_000) == 1_000
    assert tl.host(500) == 500
    assert clocks(tl) == (1_500, 0)
    assert tl.end_ns() == 1_500


def test_enqueue_host_pays_launch_device_runs_after_launch():
    tl = Timeline()
    assert tl.enqueue(5_000, 20_000) == 5_000
    assert clocks(tl) == (5_000, 25_000)
    assert tl.end_ns() == 25_000


def test_enqueue_queues_behind_earlier_device_work():
    tl = Timeline()
    tl.enqueue(5_000, 20_000)
    assert tl.enqueue(5_000, 10_000) == 5_000
    assert clocks(tl) == (10_000, 35_000)


def test_enqueue_on_idle_device_starts_when_launched():
    tl = Timeline()
    tl.enqueue(5_000, 1_000)       # device done at 6_000
    tl.host(20_000)                 # host at 25_000, device idle since 6_000
    assert tl.enqueue(5_000, 1_000) == 5_000
    assert clocks(tl) == (30_000, 31_000)


def test_blocking_copy_makes_the_host_wait_for_the_kernel():
    tl = Timeline()
    tl.enqueue(5_000, 20_000)
    # The copy queues behind the kernel (ends 25_000), runs 2_000, then the host wakes 5_000 later.
    assert tl.blocking(0, 2_000, 5_000) == 27_000
    assert clocks(tl) == (32_000, 27_000)
    assert tl.end_ns() == 32_000


def test_blocking_copy_on_idle_device():
    tl = Timeline()
    assert tl.blocking(5_000, 2_000, 5_000) == 12_000
    assert clocks(tl) == (12_000, 7_000)


def test_blocking_copy_after_host_work_past_the_device():
    tl = Timeline()
    tl.enqueue(5_000, 1_000)       # device done at 6_000
    tl.host(10_000)                 # host at 15_000
    assert tl.blocking(1_000, 2_000, 5_000) == 8_000
    assert clocks(tl) == (23_000, 18_000)


def test_staged_copy_does_not_wait_for_earlier_device_work():
    tl = Timeline()
    tl.enqueue(5_000, 20_000)       # device busy until 25_000
    # The host stages the pageable copy (launch + transfer) without waiting for the kernel;
    # the device runs the transfer after the kernel.
    assert tl.staged(5_000, 3_000) == 8_000
    assert clocks(tl) == (13_000, 28_000)


def test_staged_copy_on_idle_device():
    tl = Timeline()
    assert tl.staged(5_000, 3_000) == 8_000
    assert clocks(tl) == (8_000, 8_000)


def test_drain_on_idle_device_costs_only_sync():
    tl = Timeline()
    assert tl.drain(5_000) == 5_000
    assert clocks(tl) == (5_000, 0)


def test_drain_waits_for_queued_work():
    tl = Timeline()
    tl.enqueue(5_000, 20_000)
    assert tl.drain(5_000) == 25_000
    assert clocks(tl) == (30_000, 25_000)


def test_drain_when_device_already_finished():
    tl = Timeline()
    tl.enqueue(5_000, 20_000)
    tl.host(50_000)                 # host at 55_000, device done at 25_000
    assert tl.drain(5_000) == 5_000
    assert clocks(tl) == (60_000, 25_000)


def test_a_step_of_kernels_copies_and_a_wait():
    """enqueue, enqueue, staged, blocking, host, drain: every clock value by hand."""
    tl = Timeline()
    host_times = [
        tl.enqueue(5_000, 100_000),  # h 5_000     d 105_000
        tl.enqueue(5_000, 50_000),   # h 10_000    d 155_000
        tl.staged(5_000, 10_000),    # h 25_000    d 165_000
        tl.blocking(5_000, 1_000, 5_000),  # h 30_000 -> d 166_000, h 171_000
        tl.host(9_000),              # h 180_000
        tl.enqueue(5_000, 40_000),   # h 185_000   d 225_000
        tl.drain(5_000),             # h 230_000
    ]
    assert host_times == [5_000, 5_000, 15_000, 146_000, 9_000, 5_000, 45_000]
    assert clocks(tl) == (230_000, 225_000)
    assert tl.end_ns() == 230_000
    assert sum(host_times) == tl.host_ns


# ----- DeviceProfile.kernel_ns -----

def test_kernel_ns_compute_bound():
    p = make_profile()
    # 2 GFLOP at 1 TFLOP/s = 2 ms; 1 MB at 1 TB/s = 1 us.
    assert p.kernel_ns(2e9, 1_000_000, "float32") == 2_000 + 2_000_000


def test_kernel_ns_memory_bound():
    p = make_profile()
    # 1 MFLOP = 1 us; 4 GB at 1 TB/s = 4 ms.
    assert p.kernel_ns(1e6, 4_000_000_000, "float32") == 2_000 + 4_000_000


def test_kernel_ns_uses_the_dtype_peak():
    p = make_profile()
    assert p.kernel_ns(4e9, 0, "float16") == 2_000 + 1_000_000


def test_kernel_ns_unknown_dtype_uses_other():
    p = make_profile()
    # 1 GFLOP at 0.5 TFLOP/s = 2 ms.
    assert p.kernel_ns(1e9, 0, "int8") == 2_000 + 2_000_000
    assert p.kernel_ns(1e9, 0, "int8") == p.kernel_ns(1e9, 0, "other")


def test_kernel_ns_empty_kernel_costs_the_minimum():
    assert make_profile().kernel_ns(0, 0, "float32") == 2_000


# ----- DeviceProfile.copy_ns -----

def test_copy_ns_htod_pinned_vs_pageable():
    p = make_profile()
    assert p.copy_ns("HtoD", 20_000_000, True) == 1_000 + 1_000_000
    assert p.copy_ns("HtoD", 20_000_000, False) == 1_000 + 2_000_000


def test_copy_ns_unknown_pinning_counts_as_pageable():
    p = make_profile()
    assert p.copy_ns("HtoD", 20_000_000, None) == p.copy_ns("HtoD", 20_000_000, False)


def test_copy_ns_dtoh_pinned_vs_pageable():
    p = make_profile()
    assert p.copy_ns("DtoH", 20_000_000, True) == 1_000 + 500_000
    assert p.copy_ns("DtoH", 20_000_000, False) == 1_000 + 4_000_000


def test_copy_ns_dtod_ignores_pinning():
    p = make_profile()
    assert p.copy_ns("DtoD", 20_000_000, None) == 1_000 + 200_000
    assert p.copy_ns("DtoD", 20_000_000, True) == 1_000 + 200_000
    assert p.copy_ns("DtoD", 20_000_000, False) == 1_000 + 200_000


def test_copy_ns_empty_copy_costs_the_setup():
    assert make_profile().copy_ns("HtoD", 0, True) == 1_000


def test_copy_ns_unknown_direction_raises():
    with pytest.raises(KeyError):
        make_profile().copy_ns("sideways", 10, True)


def test_copy_ns_exact_for_whole_nanoseconds_on_shipped_profile():
    p = load_profile()
    assert p.copy_bandwidth["DtoH_pinned"] == 25e9
    assert p.copy_ns("DtoH", 13_000_000, True) == 2_000 + 520_000


# ----- profiles -----

def test_profile_dict_round_trip():
    p = make_profile(compute_capability=(9, 0), calibrated=True, sources={"launch_ns": "x"})
    d = p.to_dict()
    assert d["compute_capability"] == [9, 0]
    assert json.loads(json.dumps(d)) == d
    assert DeviceProfile.from_dict(d) == p


def test_from_dict_missing_field_raises_profile_error():
    d = make_profile().to_dict()
    del d["sync_ns"]
    with pytest.raises(ProfileError, match="sync_ns"):
        DeviceProfile.from_dict(d)


def test_from_dict_unknown_field_raises_profile_error():
    d = make_profile().to_dict()
    d["warp_size"] = 32
    with pytest.raises(ProfileError, match="warp_size"):
        DeviceProfile.from_dict(d)


def test_available_profiles():
    assert available_profiles() == ["a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb",
                                    "l4", "rtx-4090"]
    assert DEFAULT_DEVICE_PROFILE in available_profiles()


def test_load_default_profile_is_the_shipped_a100():
    p = load_profile()
    assert p == load_profile(None) == load_profile("a100-sxm4-80gb")
    assert p.name == "NVIDIA A100-SXM4-80GB"
    assert p.calibrated is False
    assert p.compute_capability == (8, 0)
    assert p.multi_processor_count == 108
    assert p.total_memory_bytes == 80 * 2**30
    assert p.peak_flops == {"float64": 9.7e12, "float32": 19.5e12, "float16": 312e12,
                            "bfloat16": 312e12, "other": 19.5e12}
    assert p.memory_bandwidth == 2.039e12
    assert p.copy_bandwidth == {"HtoD_pinned": 24e9, "HtoD_pageable": 12e9,
                                "DtoH_pinned": 25e9, "DtoH_pageable": 10e9, "DtoD": 250e9}
    assert (p.launch_ns, p.kernel_min_ns, p.copy_setup_ns, p.sync_ns) == (
        5_000, 2_000, 2_000, 5_000)


def test_shipped_profile_has_a_source_for_every_cost_figure():
    p = load_profile()
    for figure in ("peak_flops", "memory_bandwidth", "copy_bandwidth", "launch_ns",
                   "kernel_min_ns", "copy_setup_ns", "sync_ns"):
        assert p.sources.get(figure, "").strip(), figure


def test_shipped_profile_figures_on_round_sizes():
    p = load_profile()
    # 24 MB pinned HtoD at 24 GB/s = 1 ms, plus 2 us setup.
    assert p.copy_ns("HtoD", 24_000_000, True) == 2_000 + 1_000_000
    assert p.copy_ns("HtoD", 24_000_000, False) == 2_000 + 2_000_000
    # 19.5 GFLOP float32 = 1 ms, plus the shortest kernel.
    assert p.kernel_ns(19.5e9, 0, "float32") == 2_000 + 1_000_000


def test_load_unknown_profile_lists_shipped_names():
    with pytest.raises(ProfileError) as info:
        load_profile("nope")
    message = str(info.value)
    assert "'nope'" in message
    assert "a100-sxm4-80gb" in message


def test_load_profile_from_json_path(tmp_path):
    p = make_profile()
    path = tmp_path / "round.json"
    path.write_text(json.dumps(p.to_dict()), encoding="utf-8")
    assert load_profile(str(path)) == p


def test_load_profile_from_relative_json_name(tmp_path, monkeypatch):
    """A name ending in .json is a file path, even without a directory separator."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "round.json").write_text(json.dumps(make_profile().to_dict()))
    assert load_profile("round.json") == make_profile()


def test_load_profile_missing_file(tmp_path):
    path = tmp_path / "missing.json"
    with pytest.raises(ProfileError, match="cannot read device profile"):
        load_profile(str(path))


def test_load_profile_invalid_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    assert str(path) in str(info.value)


def test_load_profile_incomplete_json(tmp_path):
    path = tmp_path / "partial.json"
    path.write_text(json.dumps({"name": "partial"}))
    with pytest.raises(ProfileError, match="peak_flops"):
        load_profile(str(path))


@pytest.mark.parametrize("content", ["[1, 2]", "5"])
def test_load_profile_json_not_an_object(tmp_path, content):
    path = tmp_path / "list.json"
    path.write_text(content)
    with pytest.raises(ProfileError):
        load_profile(str(path))


def test_profile_bad_compute_capability(tmp_path):
    d = make_profile().to_dict()
    d["compute_capability"] = 8
    with pytest.raises(ProfileError):
        DeviceProfile.from_dict(d)


# ----- the per-op path's copy of Timeline.enqueue -----

@pytest.mark.parametrize("host0, device0", [(0, 0), (50_000, 10_000), (10_000, 50_000),
                                            (30_000, 35_000)])
def test_the_per_op_path_queues_a_kernel_as_timeline_enqueue_does(host0, device0):
    # tracer/perop.py writes Timeline.enqueue out for each simulated kernel (a call costs
    # 420 instructions an op); both must move the clocks alike, device idle or busy
    import torch

    from memcpy_doctor.tracer.context import RunRecords
    from memcpy_doctor.tracer.optable import op_info
    from memcpy_doctor.tracer.perop import recorder
    from memcpy_doctor.tracer.sim.device import SimDevice

    profile = make_profile()
    sim = SimDevice(lambda s: RunRecords(profile, s, None).context())
    ctx = sim.main_state
    a, b = torch.ones(64, 64), torch.ones(64, 64)
    out = a @ b
    timeline = ctx.timeline
    timeline.host_ns, timeline.device_ns, timeline.busy_ns = host0, device0, 7
    agg = recorder(ctx)(op_info(torch.ops.aten.mm.default), (a, b), {}, (a, b), out, (out,),
                        [True, True], True, "cuda:0", None, 0)
    expected = Timeline()
    expected.host_ns, expected.device_ns, expected.busy_ns = host0, device0, 7
    assert expected.enqueue(profile.launch_ns, agg.model_ns) == profile.launch_ns
    expected.busy_ns += agg.model_ns  # (what the per-op path adds for compiled regions)
    assert (timeline.host_ns, timeline.device_ns, timeline.busy_ns) == (
        expected.host_ns, expected.device_ns, expected.busy_ns)
    assert agg.model_ns == profile.kernel_ns(2 * 64 ** 3, 3 * 64 * 64 * 4, "float32")
