#!/usr/bin/env python3
"""bench/tinygrad_step.py - one tinygrad training step, locally and on kexd, side by side.

The same tinygrad 0.9.0 program (../shared/anchors) runs its training step on
  CLANG        tinygrad's own C device, on this host's CPU
  GPU          tinygrad's own OpenCL device (GPU=1): PoCL here, the same OpenCL device kexd uses
  KEX          kexd on this machine (kex.tinygrad), its default device
each with and without TinyJit, each in a process of its own.  Programs:
  digits       examples/tinygrad_digits.py's CNN step (batch 64, Conv2d/BatchNorm2d/Linear, Adam)
  transformer  a pre-norm transformer block (batch 16 x 128 tokens, width 128, 4 heads, GELU MLP), Adam
  chain100     100 dependent elementwise kernels on 4096 floats (with --programs chain100): the cost per kernel
Per run: the first step (cold: compiles, uploads), the median of the warm steps, and on KEX the bytes
sent per warm step (Submit requests -- a kept graph's are only its bindings -- and uploads).  "KEX jit 2nd" is
a later process on the same kexd: its first step finds the kernels the program's first KEX process (the
no-jit one, on a fresh kexd) compiled; the ratio of the two first steps is reported.  The kexd is started here (its own
port, a fresh cache file), so the first KEX process is cold.  Ratios are against the same device's
jitted local tinygrad (KEX jit / GPU jit) and against CLANG jit.

Usage: /usr/bin/python3 bench/tinygrad_step.py [--steps 12] [--programs digits,transformer]
                                               [--out bench/results/tinygrad-step.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINYGRAD = os.path.join(ROOT, "..", "shared", "anchors", "tinygrad-0.9.0")
sys.path.insert(0, os.path.join(ROOT, "client", "python", "tests"))
from kexd_proc import Kexd  # noqa: E402  (a kexd of this script's own)
MODES = [("CLANG", False), ("CLANG", True), ("GPU", False), ("GPU", True), ("KEX", False), ("KEX", True),
         ("KEX", True)]   # the last: a second process on the same kexd


def train_step(opt, loss_of):
    """A training step: zero the gradients, loss_of(x, y) backward, opt.step(); the realized loss."""
    from tinygrad import Tensor

    def step(x, y):
        with Tensor.train():
            opt.zero_grad()
            loss = loss_of(x, y).backward()
            opt.step()
            return loss.realize()
    return step


def digits_program():
    """(step(x, y) -> loss, inputs() -> (x, y)) for the digits CNN."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import numpy as np
    from tinygrad import Tensor, nn
    from tinygrad_digits import DigitsCNN, load_digits
    X, _, y, _ = load_digits(0)
    model = DigitsCNN()
    opt = nn.optim.Adam(nn.state.get_parameters(model), lr=3e-3)
    rng = np.random.default_rng(0)

    step = train_step(opt, lambda x, yb: model(x).sparse_categorical_crossentropy(yb))

    def inputs():
        idx = rng.choice(len(X), size=64, replace=False)
        return Tensor(X[idx]), Tensor(y[idx])
    return step, inputs


class Block:
    def __init__(self, d=128, heads=4):
        from tinygrad import nn
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def __call__(self, x):
        B, T, D = x.shape
        q, k, v = [t.reshape(B, T, self.heads, D // self.heads).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).chunk(3, dim=2)]
        a = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + self.proj(a)
        return x + self.fc2(self.fc1(self.ln2(x)).gelu())


def transformer_program():
    import numpy as np
    from tinygrad import Tensor, nn
    block = Block()
    opt = nn.optim.Adam(nn.state.get_parameters(block), lr=1e-3)
    rng = np.random.default_rng(0)

    step = train_step(opt, lambda x, target: (block(x) - target).square().mean())

    def inputs():
        return (Tensor(rng.standard_normal((16, 128, 128), dtype=np.float32)),
                Tensor(rng.standard_normal((16, 128, 128), dtype=np.float32)))
    return step, inputs


def chain_program(n=int(os.environ.get("KEX_BENCH_CHAIN", "100"))):
    """A step of n dependent small kernels (4096 floats each): the per-kernel cost inside one step."""
    import numpy as np
    from tinygrad import Tensor
    w = Tensor(np.ones(4096, np.float32)).contiguous().realize()

    def step(x, _):
        for _ in range(n):
            x = (x * 0.999 + w).contiguous()
        return x.sum().realize()

    def inputs():
        return Tensor(np.zeros(4096, np.float32)), None
    return step, inputs


PROGRAMS = {"digits": digits_program, "transformer": transformer_program, "chain100": chain_program}


def child(program, device, jit, steps, server):
    """One run in this process: prints its JSON result."""
    sys.path[:0] = [TINYGRAD, os.path.join(ROOT, "client", "python")]
    if device == "GPU":
        os.environ["GPU"] = "1"
    kt = None
    if device == "KEX":
        import kex.tinygrad as kt
        kt.install(server=server)
    from tinygrad import Device, Tensor, TinyJit
    from tinygrad.helpers import GlobalCounters
    Device.DEFAULT = device
    Tensor.manual_seed(0)
    step, inputs = PROGRAMS[program]()
    if jit:
        step = TinyJit(step)
    times, sent, kernels, losses = [], [], [], []
    for _ in range(steps):
        x, y = inputs()
        s0 = kt.stats() if kt else None
        k0 = GlobalCounters.kernel_count
        t0 = time.perf_counter()
        loss = step(x, y)
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
        kernels.append(GlobalCounters.kernel_count - k0)
        if kt:
            s1 = kt.stats()
            sent.append(sum(s1[k] - s0[k] for k in ("request_bytes", "upload_bytes")))
    out = {"program": program, "device": device, "jit": jit, "first_s": times[0],
           "warm_s": statistics.median(times[3:]) if len(times) > 4 else times[-1], "losses": losses[:3],
           "exec_items_per_step": kernels[-1]}
    if kt:
        out["kexd_device"] = kt.client().default_device()
        out["bytes_per_warm_step"] = statistics.median(sent[3:]) if len(sent) > 4 else sent[-1]
    print("RESULT " + json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--programs", default="digits,transformer")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "tinygrad-step.json"))
    ap.add_argument("--kexd", default=os.path.join(ROOT, "build", "daemon", "kexd"))
    ap.add_argument("--child", nargs=4, metavar=("PROGRAM", "DEVICE", "JIT", "SERVER"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], a.child[2] == "1", a.steps, a.child[3])
        return 0
    kexd = Kexd(kexd=a.kexd)
    server = kexd.addr
    results = []
    try:
        for program in a.programs.split(","):
            for device, jit in MODES:
                cmd = [sys.executable, os.path.abspath(__file__), "--steps", str(a.steps), "--child", program, device,
                       "1" if jit else "0", server]
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
                line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
                if p.returncode or not line:
                    print(f"{program} {device} jit={jit}: failed\n{p.stderr[-2000:]}", file=sys.stderr)
                    continue
                r = json.loads(line[-1][7:])
                r["second_process"] = device == "KEX" and jit and any(
                    x["program"] == program and x["device"] == "KEX" and x["jit"] for x in results)
                results.append(r)
                print(f"{program:12s} {device:6s} {'jit' if jit else '   '}{' 2nd' if r['second_process'] else '    '} "
                      f"first {r['first_s'] * 1e3:9.1f} ms  warm {r['warm_s'] * 1e3:8.2f} ms"
                      + (f"  {r['bytes_per_warm_step']:8.0f} B/step" if "bytes_per_warm_step" in r else ""),
                      flush=True)
    finally:
        kexd.stop()
    ratios = {}
    for program in a.programs.split(","):
        def get(device, jit, second=False):
            for r in results:
                if r["program"] == program and r["device"] == device and r["jit"] == jit and \
                        r.get("second_process", False) == second:
                    return r
            return None
        kj, gj, cj, k2 = get("KEX", True), get("GPU", True), get("CLANG", True), get("KEX", True, True)
        k1 = get("KEX", False)   # the program's first process on this (fresh) kexd
        ratios[program] = {
            "kex_jit_warm_vs_gpu_jit": kj and gj and kj["warm_s"] / gj["warm_s"],
            "kex_jit_warm_vs_clang_jit": kj and cj and kj["warm_s"] / cj["warm_s"],
            "kex_later_process_first_vs_first_process": k1 and k2 and k2["first_s"] / k1["first_s"],
        }
        print(f"{program}: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios[program].items() if v))
    host = subprocess.run(["uname", "-srm"], capture_output=True, text=True).stdout.strip()
    json.dump({"host": host, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "steps": a.steps,
               "results": results, "ratios": ratios}, open(a.out, "w"), indent=1)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
