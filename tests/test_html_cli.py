"""`report --html OUT.html` and `profile --html OUT.html` (issue 44): the page written, one
line saying where; a path that cannot be written is one line and exit status 2."""

from __future__ import annotations

import subprocess
import sys

from helpers import cli_in_process, make_trace


def test_report_writes_the_page_instead_of_the_text(tmp_path):
    make_trace().save(tmp_path / "t.json")
    r = cli_in_process("report", "--html", "out.html", "t.json", cwd=tmp_path)
    assert (r.status, r.out, r.err) == (0, "", "memcpy-doctor: HTML report written to "
                                                "out.html\n")
    page = (tmp_path / "out.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "Sync copies" in page
    r = cli_in_process("report", "--html", "nowhere/out.html", "t.json", cwd=tmp_path)
    assert (r.status, r.err) == (2, "memcpy-doctor: error: --html nowhere/out.html: No such "
                                    "file or directory\n")


def test_profile_writes_the_page_beside_the_trace(tmp_path):
    (tmp_path / "s.py").write_text("import torch\nx = torch.ones(2, device='cuda')\n"
                                   "for _ in range(3):\n    x.sum().item()\n")
    r = subprocess.run([sys.executable, "-m", "memcpy_doctor", "profile", "--device", "sim",
                        "--html", "p.html", "s.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[-1] == "memcpy-doctor: HTML report written to p.html"
    assert "s.py:4" in (tmp_path / "p.html").read_text()
    r = cli_in_process("profile", "--device", "sim", "--html", "no/p.html", "s.py",
                       cwd=tmp_path)
    assert r.status == 2 and r.err == (f"memcpy-doctor: error: --html no/p.html: directory "
                                       f"{tmp_path / 'no'} does not exist\n")
