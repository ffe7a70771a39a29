#!/usr/bin/env python3
"""A JUnit XML file as CI tools read it (the common JUnit XSD's shape), checked with xml.etree:
<testsuites> holding <testsuite>s holding <testcase>s; every suite (and the root) carries tests,
failures, errors, skipped and time, and its counts are its testcases' (tests = failures + errors +
skipped + passed), the root's the sum of its suites'; every testcase carries classname, name and time,
and holds at most one of <failure>, <error>, <skipped>, each with a message.

usage: check_junit.py FILE [tests=N] [failures=N] [errors=N] [skipped=N] [passed=N]
The optional counts are the root's, as expected. Exit 0 when it holds, 1 with the reasons otherwise."""
import math
import sys
import xml.etree.ElementTree as ET

COUNTS = ("tests", "failures", "errors", "skipped")


def number(el, key, why, integer=True):
    v = el.get(key)
    if v is None:
        why.append(f"<{el.tag} name={el.get('name')!r}> has no {key} attribute")
        return 0
    try:
        x = int(v) if integer else float(v)
    except ValueError:
        why.append(f"<{el.tag} name={el.get('name')!r}> {key}={v!r} is not a {'whole ' if integer else ''}number")
        return 0
    if x < 0 or (not integer and not math.isfinite(x)):
        why.append(f"<{el.tag} name={el.get('name')!r}> {key}={v!r} is negative or not finite")
    return x


def outcome(case, why):
    found = [c for c in case if c.tag in ("failure", "error", "skipped")]
    if len(found) > 1:
        why.append(f"testcase {case.get('name')!r} holds {[c.tag for c in found]}: one at most")
    for c in found:
        if c.get("message") is None:
            why.append(f"testcase {case.get('name')!r}: <{c.tag}> has no message")
    return found[0].tag if found else "passed"


def check(path, want):
    why = []
    root = ET.parse(path).getroot()
    if root.tag != "testsuites":
        return [f"the root is <{root.tag}>, not <testsuites>"], {}
    total = dict.fromkeys(COUNTS + ("passed",), 0)
    time_sum = 0.0
    suites = root.findall("testsuite")
    if not suites:
        why.append("no <testsuite>")
    for s in suites:
        if not s.get("name"):
            why.append("a <testsuite> has no name")
        got = {k: number(s, k, why) for k in COUNTS}
        t = number(s, "time", why, integer=False)
        cases = s.findall("testcase")
        seen = dict.fromkeys(("passed", "failure", "error", "skipped"), 0)
        case_time = 0.0
        for c in cases:
            for k in ("classname", "name"):
                if not c.get(k):
                    why.append(f"a testcase in {s.get('name')!r} has no {k}")
            case_time += number(c, "time", why, integer=False)
            seen[outcome(c, why)] += 1
        counted = {"tests": len(cases), "failures": seen["failure"], "errors": seen["error"], "skipped": seen["skipped"]}
        for k in COUNTS:
            if got[k] != counted[k]:
                why.append(f"testsuite {s.get('name')!r}: {k}={got[k]}, but it holds {counted[k]}")
        if got["tests"] != got["failures"] + got["errors"] + got["skipped"] + seen["passed"]:
            why.append(f"testsuite {s.get('name')!r}: tests != failures + errors + skipped + passed")
        if abs(t - case_time) > 1e-6 * (len(cases) + 1):
            why.append(f"testsuite {s.get('name')!r}: time={t}, but its testcases' add up to {case_time}")
        for k in COUNTS:
            total[k] += counted[k]
        total["passed"] += seen["passed"]
        time_sum += t
    for k in COUNTS:
        if number(root, k, why) != total[k]:
            why.append(f"<testsuites> {k}={root.get(k)}, but its suites hold {total[k]}")
    if number(root, "time", why, integer=False) < time_sum - 1e-6 * (len(suites) + 1):
        why.append(f"<testsuites> time={root.get('time')} is less than its suites' {time_sum}")
    for k, v in want.items():
        if total.get(k) != v:
            why.append(f"expected {k}={v}, the file has {total.get(k)}")
    return why, total


if __name__ == "__main__":
    want = {k: int(v) for k, v in (a.split("=", 1) for a in sys.argv[2:])}
    why, total = check(sys.argv[1], want)
    for w in why:
        print(f"{sys.argv[1]}: {w}", file=sys.stderr)
    sys.exit(1 if why else 0)
