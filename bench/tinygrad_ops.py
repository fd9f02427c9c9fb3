#!/usr/bin/env python3
"""bench/tinygrad_ops.py - tinygrad 0.9.0's operator suite (test/test_ops.py) on a device, against CLANG.

Every helper_test_op case of test_ops.py runs on the reference device (CLANG) and on the device under test
(KEX: a kexd through kex.tinygrad), forward and backward, and the device's outputs and gradients are compared
with the reference's with the case's own tolerances (client/python/tests/tg_ops_diff.py says how, torch being
a stand-in).  Cases the reference itself cannot run are left out and listed.  Writes a Markdown report:
totals (forward / backward pass %, expected exceptions, direct assertions), the failing cases grouped by reason
and each with its reason, and what was left out.

With --device KEX and no --server, starts its own kexd (--kexd, default build/daemon/kexd) on a free
127.0.0.1 port with --metrics off and a temporary --cache, as client/python/tests/conftest.py does.

usage: /usr/bin/python3 bench/tinygrad_ops.py [--device KEX] [--ref CLANG] [--server ADDR | --kexd PATH]
         [--filter REGEX] [--sample N] [--case-timeout S] [--out FILE]
  --filter REGEX   only the case ids re.search matches (ids: TestOps.test_add#0, TestOps.test_dot!exc#1,
                   TestOps.test_argmax:direct)
  --sample N       N cases spread evenly over the (filtered) list
  --out FILE       the report (default bench/results/tinygrad-ops.md for a whole run; with --filter or
                   --sample, stdout unless --out is given)
"""
import argparse
import collections
import datetime
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "client", "python", "tests"), os.path.join(ROOT, "client", "python")]
import tg_ops_diff as T  # noqa: E402
from kexd_proc import Kexd  # noqa: E402


def reason_group(reason):
    """A failure reason without its numbers and values: failures of one cause share it."""
    if reason.startswith("not reached"):
        m = re.search(r"raised on \S+ at (\S+): (\w+)", reason)
        return f"not reached: the method body raised earlier ({m.group(2)})" if m else "not reached"
    if "differ, max abs diff" in reason:
        return reason.split(":")[0] + ": values differ"
    if re.match(r"(forward|backward pass tensor \d+): (shape|dtype)", reason):
        what, rest = reason.split(": ", 1)
        return re.sub(r"tensor \d+", "tensor N", what) + ": " + re.sub(r"\(\d[\d, ]*\)", "(...)", rest)
    r = re.sub(r"0x[0-9a-f]+", "X", reason)
    r = re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", r)
    r = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", r)
    at = re.search(r"\[at [^\]]*\]$", r)
    head = r[:at.start()] if at else r
    return (head[:140] + (" ..." if len(head) > 140 else "") + (" " + at.group(0) if at else "")).strip()


def pct(p, f):
    return f"{100.0 * p / (p + f):.2f} %" if p + f else "-"


def report(results, notes, a, ncases, nall, seconds, tg_root):
    tot = T.totals(results)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    scope = "every case" if ncases == nall else f"{ncases} of {nall} cases"
    if a.filter:
        scope += f", --filter {a.filter!r}"
    if a.sample:
        scope += f", --sample {a.sample}"
    L = [f"# tinygrad 0.9.0's test_ops.py on {a.device}, against {a.ref}", "",
         f"Issue 29 item 3.  `bench/tinygrad_ops.py --device {a.device}` on "
         f"{datetime.date.today().isoformat()} (commit {commit}), {scope}, {seconds:.0f} s.",
         f"tinygrad: {os.path.relpath(tg_root, ROOT)}.  Method: client/python/tests/tg_ops_diff.py (its docstring):",
         "each helper_test_op case runs on the reference and on the device with identical inputs; the device's",
         "forward outputs and, unless forward_only, the gradients of (out+1).square().mean() must match the",
         "reference's with the case's atol/rtol (grad_atol/grad_rtol), shape and dtype exactly.  torch is a",
         "stand-in: cases that need it, or that the reference cannot run, are left out (listed below).", ""]
    if getattr(a, "kex_stats", None):
        L += ["kexd calls of the run (kex.tinygrad.stats()): " +
              ", ".join(f"{k} {v}" for k, v in a.kex_stats.items()) + ".", ""]
    L += ["| | pass | fail | left out | pass % (of run) |", "|---|---:|---:|---:|---:|"]
    for k, label in (("forward", "forward"), ("backward", "backward"), ("exception", "expected exceptions"),
                     ("direct", "direct assertions")):
        p, f, lo = tot[k]
        L.append(f"| {label} | {p} | {f} | {lo} | {pct(p, f)} |")
    p1, f1, _ = tot["forward"]
    p2, f2, _ = tot["backward"]
    ok = p1 + f1 and p2 + f2 and p1 / (p1 + f1) >= 0.98 and p2 / (p2 + f2) >= 0.98
    L += ["", f"Target >= 98 % forward and backward: {'met' if ok else 'NOT met'}.", ""]

    failing = [r for r in results if r.failed]
    groups = collections.OrderedDict()
    for r in failing:
        for what, st, why in (("forward", r.forward, r.forward_reason), ("backward", r.backward, r.backward_reason)):
            if st == "fail" and not (what == "backward" and why == "forward raised"):
                groups.setdefault(reason_group(why), []).append(r.id)
    L += [f"## Failure groups ({len(groups)})", ""]
    if not groups:
        L.append("None.")
    for g, ids in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        shown = ", ".join(f"`{i}`" for i in ids[:6]) + (f", ... ({len(ids) - 6} more)" if len(ids) > 6 else "")
        L.append(f"- {len(ids)} x {g.replace('|', '/')}: {shown}")
    L += ["", f"## Failing cases ({len(failing)})", ""]
    if not failing:
        L.append("None.")
    for r in failing:
        parts = []
        for what, st, why in (("forward", r.forward, r.forward_reason), ("backward", r.backward, r.backward_reason)):
            if st == "fail":
                parts.append(why if why.startswith(what) else f"{what}: {why}")
        L.append(f"- `{r.id}` (test_ops.py:{r.line}, {r.desc}): " + "; ".join(parts))
    left = [r for r in results if r.forward == "left_out" or r.backward == "left_out"]
    L += ["", f"## Left out: the reference ({a.ref}, torch a stand-in) cannot run them ({len(left)} cases)", ""]
    for r in left:
        if r.forward == "left_out":
            L.append(f"- `{r.id}` (test_ops.py:{r.line}, {r.desc}): {r.forward_reason}")
        else:
            L.append(f"- `{r.id}` backward (test_ops.py:{r.line}, {r.desc}): {r.backward_reason}")
    if notes:
        L += ["", "Statements and methods the reference cannot run (no case of their own, or their cases are not "
                  "enumerated):", ""]
        for n in notes:
            L.append(f"- `{n.method}` (test_ops.py:{n.line}): {n.text}")
    return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="KEX")
    ap.add_argument("--ref", default="CLANG")
    ap.add_argument("--server", help="a running kexd (host:port); default: start one")
    ap.add_argument("--kexd", default=os.path.join(ROOT, "build", "daemon", "kexd"))
    ap.add_argument("--filter", help="only case ids this regular expression matches (re.search)")
    ap.add_argument("--sample", type=int, help="N cases spread evenly over the list")
    ap.add_argument("--case-timeout", type=float, default=120.0)
    ap.add_argument("--out", help="the report (default: bench/results/tinygrad-ops.md for a whole run)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    out = a.out or (None if (a.filter or a.sample) else os.path.join(ROOT, "bench", "results", "tinygrad-ops.md"))

    kexd = None
    if a.device.upper() == "KEX":
        why = T.kex_tinygrad_ready()
        if why:
            raise SystemExit(f"device KEX: {why}")
        if not a.server:
            kexd = Kexd(kexd=a.kexd)
            a.server = kexd.addr
    try:
        T.install_device(a.device, a.server)
        log = None if a.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
        runner = T.Runner(dut=a.device, ref=a.ref, case_timeout=a.case_timeout, log=log)
        cases = runner.discover()
        chosen = [c for c in cases if not a.filter or re.search(a.filter, c.id)]
        if a.sample:
            chosen = T.sample_n(chosen, a.sample)
        select = None if len(chosen) == len(cases) else {c.id for c in chosen}
        methods = None if select is None else list(dict.fromkeys(c.method for c in chosen))
        t0 = time.monotonic()
        results = runner.run(select=select, methods=methods)
        seconds = time.monotonic() - t0
        if a.device.upper().startswith("KEX"):
            import kex.tinygrad
            a.kex_stats = kex.tinygrad.stats()
    finally:
        if kexd:
            kexd.stop()
    text = report(results, runner.notes, a, len(chosen), len(cases), seconds, runner.tm.root)
    if out:
        with open(out, "w") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(out)}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    tot = T.totals(results)
    print("forward {}/{} backward {}/{} exceptions {}/{} direct {}/{} (pass/run)".format(
        tot["forward"][0], tot["forward"][0] + tot["forward"][1], tot["backward"][0],
        tot["backward"][0] + tot["backward"][1], tot["exception"][0], tot["exception"][0] + tot["exception"][1],
        tot["direct"][0], tot["direct"][0] + tot["direct"][1]), file=sys.stderr)


if __name__ == "__main__":
    main()
