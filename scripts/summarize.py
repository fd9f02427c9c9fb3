#!/usr/bin/python3
"""summarize.py - one table and one closing line for everything scripts/test.sh ran.

Sources (each given on the command line by test.sh):
  --meson DIR                 DIR/meson-logs/testlog.json: one JSON object per line
                              (name, result, stdout, stderr, ...).  A cmocka binary
                              counts its own summary lines, which cmocka writes on
                              stderr: "[  PASSED  ] N test(s)." / "[  FAILED  ] N test(s)"
                              / "[  SKIPPED ] N test(s)".  A binary whose result is
                              not OK and that printed no failure (crash, timeout,
                              sanitizer report at exit) adds 1 failed; any other
                              meson test counts 1 passed, failed or skipped by result.
  --junit NAME XML RC         a pytest run: testcases in the junit xml; a non-zero
                              exit without a failing testcase adds 1 failed.
  --script NAME LOG RC        a test script whose last "N passed, N failed" line in
                              LOG is its count; a non-zero exit without a counted
                              failure adds 1 failed; no such line: 1 by exit status.
  --fail NAME REASON          something that could not run (setup, configure, build).
  --skip NAME REASON          something not present yet; listed, not counted.

Prints the per-suite table, the skipped tests with their reasons, and last the
line "N passed, N failed".  Exits 1 if anything failed, else 0.
Standard library only; runs with /usr/bin/python3.
"""
import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

CMOCKA_RE = re.compile(r"^\[\s*(PASSED|FAILED|SKIPPED)\s*\] (\d+) test\(s\)", re.M)
SCRIPT_RE = re.compile(r"^\s*(\d+) passed, (\d+) failed\s*$")
RUN_RE = re.compile(r"^\[ RUN\s*\] (.+)$")
SKIP_RE = re.compile(r"^\[\s*SKIPPED\s*\] (.+)$")
OK_RESULTS = ("OK", "EXPECTEDFAIL")


class Row:
    def __init__(self, name, passed=0, failed=0, skipped=0, note=""):
        self.name, self.passed, self.failed, self.skipped, self.note = name, passed, failed, skipped, note


def cmocka_skip_reasons(stdout):
    """(test, reason) for each cmocka test that was skipped.

    The reason is whatever the test printed (print_message goes to stdout)
    between its "[ RUN      ]" line and its "[  SKIPPED ]" line.
    """
    skips, current, lines = [], None, []
    for line in stdout.splitlines():
        m = RUN_RE.match(line)
        if m:
            current, lines = m.group(1).strip(), []
            continue
        m = SKIP_RE.match(line)
        if m and current is not None and m.group(1).strip() == current:
            reason = " ".join(l.strip() for l in lines if l.strip())
            skips.append((current, reason))
            current = None
            continue
        if current is not None and not line.startswith("["):
            lines.append(line)
    return skips


def meson_rows(build_dir, skipped_tests):
    path = os.path.join(build_dir, "meson-logs", "testlog.json")
    if not os.path.exists(path):
        return [Row(f"{build_dir}: meson test", failed=1, note="no meson-logs/testlog.json (tests did not run)")]
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                t = json.loads(line)
            except json.JSONDecodeError:
                rows.append(Row(f"{build_dir}: ?", failed=1, note="unreadable testlog.json line"))
                continue
            name = f"{build_dir}: {t.get('name', '?').rsplit(' / ', 1)[-1]}"
            result = t.get("result", "?")
            out = (t.get("stdout") or "") + "\n" + (t.get("stderr") or "")
            counts = {"PASSED": 0, "FAILED": 0, "SKIPPED": 0}
            seen = False
            for kind, n in CMOCKA_RE.findall(out):
                counts[kind] += int(n)
                seen = True
            row = Row(name, counts["PASSED"], counts["FAILED"], counts["SKIPPED"])
            if seen:
                if result not in OK_RESULTS and row.failed == 0:
                    row.failed, row.note = 1, f"exit: {result} after the cmocka summary"
                for test, reason in cmocka_skip_reasons(t.get("stdout") or ""):
                    skipped_tests.append((f"{name} {test}", reason))
            elif result in OK_RESULTS:
                row.passed = 1
            elif result == "SKIP":
                row.skipped = 1
                skipped_tests.append((name, "meson SKIP (exit status 77)"))
            else:
                row.failed, row.note = 1, f"{result}, no cmocka summary (crash or timeout?)"
            rows.append(row)
    if not rows:
        rows.append(Row(f"{build_dir}: meson test", note="no tests registered"))
    return rows


def junit_row(name, xml_path, rc, skipped_tests):
    rc = int(rc)
    row = Row(name)
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError) as e:
        row.failed, row.note = 1, f"exit {rc}, no junit xml ({e.__class__.__name__})"
        return row
    for case in root.iter("testcase"):
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            row.failed += 1
        elif "skipped" in kinds:
            row.skipped += 1
            msg = next(c for c in case if c.tag == "skipped").get("message", "")
            skipped_tests.append((f"{name} {case.get('classname', '')}::{case.get('name', '')}", msg))
        else:
            row.passed += 1
    if rc not in (0, 5) and row.failed == 0:  # pytest: 5 = no tests collected
        row.failed, row.note = 1, f"pytest exit {rc}"
    return row


def script_row(name, log_path, rc):
    rc = int(rc)
    row = Row(name)
    counted = False
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = SCRIPT_RE.match(line)
                if m:
                    row.passed, row.failed = int(m.group(1)), int(m.group(2))
                    counted = True
    except OSError:
        pass
    if not counted:  # counted by its exit status, like a non-cmocka meson test
        row.note = f"no 'N passed, N failed' line; exit {rc}"
        row.passed, row.failed = (1, 0) if rc == 0 else (0, 1)
    elif rc != 0 and row.failed == 0:
        row.failed, row.note = 1, f"exit {rc}"
    return row


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meson", action="append", default=[], metavar="DIR")
    ap.add_argument("--junit", action="append", default=[], nargs=3, metavar=("NAME", "XML", "RC"))
    ap.add_argument("--script", action="append", default=[], nargs=3, metavar=("NAME", "LOG", "RC"))
    ap.add_argument("--fail", action="append", default=[], nargs=2, metavar=("NAME", "REASON"))
    ap.add_argument("--skip", action="append", default=[], nargs=2, metavar=("NAME", "REASON"))
    args = ap.parse_args(argv)

    rows, skipped_tests = [], []
    for name, reason in args.fail:
        rows.append(Row(name, failed=1, note=reason))
    for d in args.meson:
        rows += meson_rows(d, skipped_tests)
    for name, xml_path, rc in args.junit:
        rows.append(junit_row(name, xml_path, rc, skipped_tests))
    for name, log_path, rc in args.script:
        rows.append(script_row(name, log_path, rc))

    width = max([len(r.name) for r in rows] + [len(name) for name, _ in args.skip] + [len("suite")])
    print()
    print("== summary ==")
    print(f"{'suite':<{width}}  {'passed':>6}  {'failed':>6}  {'skipped':>7}")
    for r in rows:
        note = f"  ({r.note})" if r.note else ""
        print(f"{r.name:<{width}}  {r.passed:>6}  {r.failed:>6}  {r.skipped:>7}{note}")
    for name, reason in args.skip:
        print(f"{name:<{width}}  {'-':>6}  {'-':>6}  {'-':>7}  (not run: {reason})")
    if skipped_tests:
        print("skipped tests:")
        for test, reason in skipped_tests:
            print(f"  {test}" + (f": {reason}" if reason else ""))
    passed = sum(r.passed for r in rows)
    failed = sum(r.failed for r in rows)
    skipped = sum(r.skipped for r in rows)
    print(f"skipped: {skipped}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
