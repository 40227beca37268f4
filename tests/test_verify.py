"""`explain --verify SCRIPT`: each suggestion re-run with its edit applied and marked by what
the re-run measured: kept when verified (with the saving measured), listed as tried when it
did not help, dropped when it made things worse or changed what the program does (how it
ended, what it printed on stdout, lines that vary between runs as written aside)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from memcpy_doctor.analysis.suggestion import Suggestion
from memcpy_doctor.render.explain import render_set_aside
from memcpy_doctor.run.verify import OutputChange, Verified, first_difference

#: 10 steps (5 with --steps 5), each an upload at line 10 and a read back at line 11, both
#: gone when the `.to("cuda")` is dropped; its first line varies from run to run.
PROGRAM = textwrap.dedent("""\
    import argparse
    import time
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    steps = parser.parse_args().steps
    print("started at", time.time())
    x = torch.randn(8, 8, device="cuda")
    total = 0
    for _ in range(steps):
        shape = torch.tensor(x.shape)
        s = shape.to("cuda") * 2
        total += s.tolist()[0]
    print(total)
""")
TITLE = "keep the data for aten::mul on the host: drop the `to` at prog.py:13"
OK = ("completed, exit status 0", "completed, exit status 0")


def verify_json(tmp_path, source: str, *args: str) -> dict:
    (tmp_path / "prog.py").write_text(source)
    done = subprocess.run([sys.executable, "-m", "memcpy_doctor", "explain", "--format", "json",
                           "--device", "sim", "--verify", "prog.py", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "prog.py").read_text() == source  # the file itself is never changed
    return json.loads(done.stdout)


@pytest.mark.parametrize("calls, total, ended, verdict, helped, worse", [
    ((20, 0), (600, 300), OK, "verified", True, False),
    ((20, 20), (600, 600), OK, "did not help", False, False),
    ((20, 20), (600, 500), OK, "did not help", False, False),  # sync calls not fewer
    ((20, 10), (600, 600), OK, "did not help", False, False),  # total not better
    ((20, 10), (600, 700), OK, "made it worse", False, True),
    ((20, 24), (600, 500), OK, "made it worse", False, True),
    ((20, 0), (600, 100), ("completed, exit status 0", "exception, exit status 1"),
     "broke the program (it ended: exception, exit status 1; as written: completed, "
     "exit status 0)", False, True),
])
def test_the_verdict_of_a_rerun(calls, total, ended, verdict, helped, worse):
    v = Verified(calls, total, ended)
    assert (v.verdict, v.helped, v.worse) == (verdict, helped, worse)
    assert v.saving_ns == total[0] - total[1]


def test_a_changed_output_rejects_an_edit_unless_it_says_it_changes_results():
    change = OutputChange(3, "loss 0.25", "loss 0.5")
    v = Verified((20, 0), (600, 300), OK, change)
    assert (v.verdict, v.rejected, v.worse) == (
        "changed the program's output (line 3: 'loss 0.25' -> 'loss 0.5')", True, True)
    said = Verified((20, 0), (600, 300), OK, change, changes_results=True)
    assert (said.verdict, said.helped) == (
        "verified; its output changed, as its title says (line 3: 'loss 0.25' -> "
        "'loss 0.5')", True)


@pytest.mark.parametrize("before, again, after, change", [
    (["a", "b"], ["a", "b"], ["a", "b"], None),
    (["a", "b", "c"], ["a", "b", "c"], ["a", "B", "C"], OutputChange(2, "b", "B")),
    # the line that varies between the runs as written is not compared
    (["t=1.5", "80"], ["t=2.5", "80"], ["t=9.5", "80"], None),
    (["t=1.5", "80"], ["t=2.5", "80"], ["t=9.5", "16"], OutputChange(2, "80", "16")),
    # a line more or less is a difference, even after a varying line
    (["80", "t=1.5"], ["80", "t=2.5"], ["80"], OutputChange(2, "t=1.5", None)),
    (["80"], ["80"], ["80", "extra"], OutputChange(2, None, "extra")),
    # the runs as written printed different counts of lines: the lines past the shorter vary
    (["80", "x"], ["80"], ["80", "y", "z"], None),
    (["80", "x"], ["80"], [], OutputChange(1, "80", None)),
])
def test_the_first_line_printed_otherwise(before, again, after, change):
    assert first_difference(before, again, after) == change


def test_a_quoted_line_is_shortened():
    change = OutputChange(7, "x" * 50, "short")
    assert str(change) == f"line 7: '{'x' * 37}...' -> 'short'"


def _suggestion(title: str, verified: Verified) -> Suggestion:
    return Suggestion("rule", title, "detail", [], [], 1_000_000, verified=verified)


def test_the_text_of_what_was_kept_tried_and_dropped():
    from memcpy_doctor.render.explain import verified_words
    kept = Verified((30, 3), (10_000_000, 8_770_000), OK)
    assert verified_words(kept) == ("verified by a re-run with the edit: sync calls 30 -> 3, "
                               "saves 1.23 ms (total 10 ms -> 8.77 ms)")
    broke = Verified((30, 3), (10_000_000, 2_000_000),
                     ("completed, exit status 0", "exception, exit status 1"))
    assert verified_words(broke) == ("broke the program (it ended: exception, exit status 1; as "
                                "written: completed, exit status 0) in a re-run with the edit")
    tried = _suggestion("pin it", Verified((30, 30), (10_000_000, 9_000_000), OK))
    dropped = _suggestion("drop it", Verified((30, 0), (10_000_000, 5_000_000), OK,
                                              OutputChange(1, "80", "16")))
    assert render_set_aside([], [dropped], [tried]).splitlines() == [
        "",
        "Tried, did not help (a re-run with the edit):",
        "- pin it: did not help by a re-run with the edit: sync calls 30 -> 30, "
        "total 10 ms -> 9 ms",
        "",
        "Dropped: a re-run with the edit made things worse or changed what the program does",
        "- drop it: changed the program's output (line 1: '80' -> '16') by a re-run with the "
        "edit: sync calls 30 -> 0, total 10 ms -> 5 ms"]


@pytest.mark.slow
def test_profile_no_report_leaves_stdout_to_the_program(tmp_path):
    """--verify compares the stdout of `profile --no-report` runs: memcpy-doctor's own
    messages (an edit not applied, the script's exit message) must go to stderr."""
    (tmp_path / "prog.py").write_text(textwrap.dedent("""\
        import sys
        import torch
        print("before")
        x = torch.ones(3, device="cuda")
        print(x.sum().item())
        sys.exit("the end")
    """))
    (tmp_path / "edits.json").write_text(json.dumps({"suggestions": [{"apply": {
        "kind": "line", "file": "prog.py", "line": 4, "old": "not this line", "new": "y"}}]}))
    done = subprocess.run([sys.executable, "-m", "memcpy_doctor", "profile", "--no-report",
                           "--device", "sim", "-o", "t.json", "--apply", "edits.json",
                           "prog.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert (done.stdout, done.returncode) == ("before\n3.0\n", 1)
    assert "the end" in done.stderr and "--apply: not applied at" in done.stderr


@pytest.mark.slow
def test_explain_verify_reruns_each_suggestion(tmp_path):
    data = verify_json(tmp_path, PROGRAM, "--", "--steps", "5")
    first = data["suggestions"][0]
    assert first["title"] == TITLE
    # 5 steps, each an upload and a read back, both gone with the `.to("cuda")` dropped; the
    # time printed first differs in every run, and is not held against the edit
    assert first["verify"]["verdict"] == "verified"
    assert first["verify"]["sync_calls"] == [10, 0]
    before, after = first["verify"]["total_ns"]
    assert after < before and first["verify"]["saving_ns"] == before - after
    assert first["verify"]["output"] is None and first["verify"]["ended"] == list(OK)
    assert data["dropped"] == [] and data["tried"] == []


@pytest.mark.slow
@pytest.mark.parametrize("end, verdict", [
    ("print(s.device)", "changed the program's output (line 3: 'cuda:0' -> 'cpu')"),
    ("sys.exit(0 if s.is_cuda else 3)",
     "broke the program (it ended: exit, exit status 3; as written: completed, "
     "exit status 0)"),
])
def test_an_edit_that_changes_what_the_program_does_is_dropped(tmp_path, end, verdict):
    source = "import sys\n" + PROGRAM + end + "\n"
    data = verify_json(tmp_path, source)
    assert [s["title"] for s in data["suggestions"]] == []
    [dropped] = data["dropped"]
    assert dropped["title"] == TITLE.replace("prog.py:13", "prog.py:14")
    assert dropped["verify"]["verdict"] == verdict
    assert dropped["verify"]["sync_calls"] == [20, 0]


@pytest.mark.slow
def test_an_edit_that_did_not_help_is_listed_as_tried(tmp_path):
    # with the `.to("cuda")` dropped, the result is uploaded a line later: as many sync calls
    source = PROGRAM.replace("    total +=", "    if not s.is_cuda:\n        s = s.cuda()\n"
                                           "    total +=")
    data = verify_json(tmp_path, source, "--", "--steps", "5")
    assert data["suggestions"] == [] and data["dropped"] == []
    [tried] = data["tried"]
    assert tried["title"] == TITLE
    assert tried["verify"]["verdict"] == "did not help"
    assert tried["verify"]["sync_calls"] == [10, 10]
    assert tried["verify"]["output"] is None


def test_verify_given_a_trace_says_it_wants_the_program(tmp_path):
    """`explain --verify t.json` would run the trace as Python (a dict literal runs): one line
    and exit 2 instead."""
    from helpers import cli_in_process

    (tmp_path / "t.json").write_text("{}")
    done = cli_in_process("explain", "--verify", "t.json", cwd=tmp_path)
    assert done.status == 2
    assert done.err == ("memcpy-doctor: error: --verify t.json: give the program to run "
                        "(explain --verify train.py), not a trace\n")
