"""Gates: metric values, parsing (never eval), allow-lists, limits and baselines, on hand-built
traces with round numbers; and the CI scenario end to end through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from helpers import cli_in_process, concurrently, make_trace
from memcpy_doctor.analysis.gates import (METRICS, GateError, allowed, check, parse_threshold,
                                          parse_tolerance)
from memcpy_doctor.run.config import load_config


def test_metric_values_on_the_hand_built_trace():
    trace = make_trace()
    copies = trace.copies
    values = {name: m.value(trace, copies) for name, m in METRICS.items()}
    assert values["copy_calls"] == 19 and values["sync_calls"] == 14
    assert values["async_calls"] == 5 and values["sync_calls_htod"] == 4
    assert values["sync_calls_dtoh"] == 10 and values["async_calls_dtoh"] == 5
    assert values["bytes_htod"] == 4_096 and values["bytes_dtoh"] == 2_000_040
    assert values["memcpy_time"] == 4_000_000 and values["sync_time"] == 3_000_000
    assert values["memcpy_ratio"] == 0.4 and values["sync_ratio"] == 0.3
    assert values["total_time"] == 10_000_000 and values["wait_calls"] == 2


@pytest.mark.parametrize("text, expected", [
    ("sync_calls=0", ("sync_calls", 0)),
    ("sync_calls <= 3", ("sync_calls", 3)),
    ("memcpy_ratio=5%", ("memcpy_ratio", 0.05)),
    ("memcpy_ratio=0.05", ("memcpy_ratio", 0.05)),
    ("bytes_htod=10MiB", ("bytes_htod", 10 * 2**20)),
    ("sync_time=2ms", ("sync_time", 2_000_000)),
    ("sync_time=1.5", ("sync_time", 1_500_000)),
    ("total_time=2s", ("total_time", 2_000_000_000)),
    ("wait_time=250us", ("wait_time", 250_000)),
])
def test_thresholds_parse(text, expected):
    assert parse_threshold(text) == expected


@pytest.mark.parametrize("text", ["sync_calls", "sync_calls=1.5", "nope=1", "sync_calls=-1",
                                  "bytes_htod=lots", "memcpy_ratio=5%%", "sync_time=2h",
                                  "__import__('os')=1", "sync_calls=__import__('os')"])
def test_bad_thresholds_are_clear_errors(text):
    with pytest.raises(GateError):
        parse_threshold(text)


def test_tolerances_parse():
    assert parse_tolerance("10%") == (None, 0.1)
    assert parse_tolerance("sync_calls=0%") == ("sync_calls", 0.0)
    with pytest.raises(GateError):
        parse_tolerance("ten")


def test_allow_list_by_line_path_and_glob():
    to, item, _ = make_trace().copies
    root = "/work/proj"
    assert allowed(to, ["train.py:42"], root) and not allowed(item, ["train.py:42"], root)
    assert allowed(item, ["train.py"], root) and allowed(item, ["*.py:5?"], root)
    assert not allowed(to, ["data.py", "train.py:41"], root)


def test_limits_fail_with_the_paths_to_fix():
    result = check(make_trace(), {"sync_calls": 0, "bytes_htod": 8_192}, root="/work/proj")
    assert not result.passed
    sync, htod = result.gates
    assert (sync.passed, sync.reason) == (False, "14 > max 0")
    assert htod.passed
    assert [(f.status, f.key, f.copy.trigger) for f in result.findings] == [
        ("over", "train.py:42", "to"), ("over", "train.py:50", "item")]


def test_allow_list_removes_paths_from_the_metrics():
    result = check(make_trace(), {"sync_calls": 4}, allow=["train.py:50"], root="/work/proj")
    assert result.passed and result.allowed_paths == 1


def test_baseline_regression_new_and_grown_paths_and_improvements():
    base = make_trace()
    new = make_trace()
    new.copies[1].calls = 12  # the .item() path grew
    extra = json.loads(json.dumps(new.to_dict()))["copies"][0]
    extra["site"].update(line=99, function="warm_up")  # a new sync HtoD path
    from memcpy_doctor.core.trace import Trace
    data = new.to_dict()
    data["copies"].append(extra)
    data["copies"][2]["bytes"] = 1_000  # the async DtoH moved fewer bytes
    new = Trace.from_dict(data)
    result = check(new, baseline=base, tolerance={None: 0.1}, root="/work/proj")
    failed = {g.metric for g in result.gates if not g.passed}
    assert failed == {"copy_calls", "sync_calls", "sync_calls_htod", "sync_calls_dtoh",
                      "bytes_htod"}
    assert {g.metric for g in result.gates if g.improved} == {"bytes_dtoh", "bytes"}
    assert [(f.status, f.key, f.baseline_calls) for f in result.findings] == [
        ("new", "train.py:99", None), ("grown", "train.py:50", 10)]
    same = check(base, baseline=base, root="/work/proj")
    assert same.passed and same.findings == []


def test_config_from_pyproject(tmp_path):
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""\
        [tool.memcpy-doctor]
        max = { sync_calls = 0, memcpy_ratio = "5%" }
        tolerance = { bytes_htod = "10%" }
        allow = ["data.py:10"]
        baseline = "ci/base.json"
    """))
    (tmp_path / "sub").mkdir()
    config = load_config(str(tmp_path / "sub"))
    assert config.limits == {"sync_calls": 0, "memcpy_ratio": 0.05}
    assert config.tolerance == {"bytes_htod": 0.1} and config.allow == ["data.py:10"]
    assert config.baseline == str(tmp_path / "ci" / "base.json")
    assert config.root == str(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[tool.memcpy-doctor]\nmax = { nope = 1 }\n")
    with pytest.raises(GateError, match="unknown metric"):
        load_config(str(tmp_path))


TRAIN = """\
import torch
torch.manual_seed(0)
model = torch.nn.Linear(8, 2).cuda()
x = torch.ones(4, 8, device="cuda")
total = torch.zeros((), device="cuda")
for step in range(5):
    loss = model(x).sum()
    total += loss.detach()
print(f"{total.item():.4f}")
"""


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "memcpy_doctor", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_ci_scenario_item_in_a_loop_fails_the_gate_and_removing_it_passes(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.memcpy-doctor]\nbaseline = "baseline.json"\n')
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    made = _cli("profile", "--device", "sim", "-o", "baseline.json", "train.py", cwd=tmp_path)
    assert made.returncode == 0, made.stderr

    train.write_text(TRAIN.replace("    total += loss.detach()\n",
                                   "    total += loss.detach()\n    print(loss.item())\n"))
    runs = [_cli("profile", "--device", "sim", "--gate", "-o", "new.json", "train.py",
                 cwd=tmp_path) for _ in range(2)]
    for run in runs:
        assert run.returncode == 1, run.stderr
        assert "FAIL sync_calls = 8, baseline 3" in run.stdout
        assert run.stdout.split("Copy paths to fix:\n")[1].splitlines()[0] == (
            "  train.py:9: new DtoH sync copy `item`, 5 calls, 20 B; aten::sum [cuda:0] at "
            "train.py:7 -> -")
        # the read after the loop moved from line 9 to 10: the same path, not a new one
        assert "train.py:10" not in run.stdout.split("Copy paths to fix:")[1]
    assert runs[0].stdout == runs[1].stdout  # the same answer twice on the same commit

    # the annotations of new.json and the run with the fix do not touch each other's files:
    # side by side
    train.write_text(TRAIN)
    annotations, fixed = concurrently(
        lambda: _cli("check", "new.json", "--format", "github", cwd=tmp_path),
        lambda: _cli("profile", "--device", "sim", "--gate", "-o", "fixed.json", "train.py",
                     cwd=tmp_path))
    assert annotations.returncode == 1
    assert "::error file=train.py,line=9," in annotations.stdout

    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "memcpy-doctor check: passed" in fixed.stdout


def test_check_usage_errors(tmp_path):
    """The bad threshold as a user runs it (a subprocess), the others through main() in this
    process."""
    (tmp_path / "t.json").write_text(make_trace().to_json())
    nothing = cli_in_process("check", "t.json", cwd=tmp_path)
    assert nothing.status == 2 and "nothing to check" in nothing.err
    bad = _cli("check", "t.json", "--max", "sync_calls=lots", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    missing = cli_in_process("check", "t.json", "--baseline", "none.json", cwd=tmp_path)
    assert missing.status == 2 and "none.json" in missing.err


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None, database=None)
@given(st.text(max_size=40) | st.from_regex(r"[a-z_]{3,16}\s*<?=\s*[0-9.%a-zA-Z ]{0,10}",
                                            fullmatch=True))
def test_threshold_parser_only_ever_gives_clear_errors(text):
    try:
        name, value = parse_threshold(text)
    except GateError as e:
        assert str(e)
    else:
        assert name in METRICS and value >= 0


@settings(max_examples=200, deadline=None, database=None)
@given(st.text(max_size=30))
def test_tolerance_parser_only_ever_gives_clear_errors(text):
    try:
        parse_tolerance(text)
    except GateError as e:
        assert str(e)
