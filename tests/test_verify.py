"""`explain --verify SCRIPT`: each suggestion re-run with its edit applied, marked by what the
re-run measured, and dropped when it made things worse or broke the program."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from memcpy_doctor.run.verify import Verified

PROGRAM = textwrap.dedent("""\
    import argparse
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    steps = parser.parse_args().steps
    x = torch.randn(8, 8, device="cuda")
    total = 0
    for _ in range(steps):
        shape = torch.tensor(x.shape)
        s = shape.to("cuda") * 2
        total += s.tolist()[0]
    print(total)
""")


@pytest.mark.parametrize("calls, total, ended, verdict, worse", [
    ((20, 0), (600, 300), ("completed", "completed"), "verified", False),
    ((20, 20), (600, 600), ("completed", "completed"), "did not help", False),
    ((20, 10), (600, 700), ("completed", "completed"), "made it worse", True),
    ((20, 24), (600, 500), ("completed", "completed"), "made it worse", True),
    ((20, 0), (600, 100), ("completed", "exception"), "broke the program (it ended: exception)",
     True),
])
def test_the_verdict_of_a_rerun(calls, total, ended, verdict, worse):
    v = Verified(calls, total, ended)
    assert (v.verdict, v.worse) == (verdict, worse)


@pytest.mark.slow
def test_explain_verify_reruns_each_suggestion(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    done = subprocess.run([sys.executable, "-m", "memcpy_doctor", "explain", "--format", "json",
                           "--device", "sim", "--verify", "prog.py", "--", "--steps", "5"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    first = data["suggestions"][0]
    assert first["title"] == "keep the data for aten::mul on the host: drop the `to` at prog.py:11"
    # 5 steps, each an upload and a read back, both gone with the `.to("cuda")` dropped
    assert first["verify"]["verdict"] == "verified"
    assert first["verify"]["sync_calls"] == [10, 0]
    before, after = first["verify"]["total_ns"]
    assert after < before
    assert data["dropped"] == []
    assert (tmp_path / "prog.py").read_text() == PROGRAM  # the file itself is never changed
