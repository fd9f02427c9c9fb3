#!/usr/bin/env python3
"""tinygrad_digits.py - train a small CNN on scikit-learn's digits with tinygrad.

A plain tinygrad 0.9.0 program: Conv2d -> BatchNorm2d -> relu (twice),
max-pool, Linear; Adam; a TinyJit'd train step in Tensor.train().  The data
are the 1797 8x8 handwritten digits that scikit-learn ships (python3-sklearn;
nothing is downloaded), split 75/25 into train and test, pixels scaled to
[0, 1].  Deterministic for a given --seed.  Reaches about 98% test accuracy in
its default 300 steps.

Run it on kexd (tinygrad's device "KEX", from kex.tinygrad):

    build/daemon/kexd --listen 127.0.0.1:50051 &
    KEX_SERVER=127.0.0.1:50051 python3 examples/tinygrad_digits.py --device KEX

or with KEX=1 in the environment (then KEX is tinygrad's default device), or
on one of tinygrad's own devices: --device CLANG.  Without tinygrad or kex on
the Python path, the copies in this checkout are used (client/python and
../shared/anchors/tinygrad-0.9.0).

The last line it prints: `test accuracy 0.981 (300 steps, 95.1 steps/s)`.
Tests import it and call train() (client/python/tests/test_tinygrad_digits.py).
"""
import argparse
import os
import sys
import time

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
for _p in (os.path.join(_ROOT, "client", "python"), os.path.join(_ROOT, "..", "shared", "anchors", "tinygrad-0.9.0")):
  if os.path.isdir(_p) and _p not in sys.path: sys.path.append(_p)  # after any installed copy

import numpy as np
from tinygrad import Device, Tensor, TinyJit, dtypes, nn


class DigitsCNN:
  """8x8x1 -> conv 3x3 (16) -> conv 3x3 (32) -> max-pool 2 -> 4x4x32 -> Linear -> 10 logits.

  The convolutions have no bias: the BatchNorm after each subtracts the batch mean, so a bias's
  gradient is rounding noise, which Adam would scale up to full-size steps."""
  def __init__(self):
    self.c1, self.bn1 = nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
    self.c2, self.bn2 = nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32)
    self.fc = nn.Linear(32 * 4 * 4, 10)

  def __call__(self, x: Tensor) -> Tensor:
    x = self.bn1(self.c1(x)).relu()
    x = self.bn2(self.c2(x)).relu().max_pool2d(2)
    return self.fc(x.flatten(1))


def load_digits(seed: int = 0, test_size: float = 0.25):
  """(X_train, X_test, y_train, y_test): float32 images (N, 1, 8, 8) in [0, 1], int32 labels."""
  from sklearn.datasets import load_digits as sk_load_digits
  from sklearn.model_selection import train_test_split
  d = sk_load_digits()
  X = (d.images / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
  y = d.target.astype(np.int32)
  return train_test_split(X, y, test_size=test_size, random_state=seed, stratify=y)


def install_kex(server=None):
  """Register tinygrad's device KEX on the kexd at `server` (else $KEX_SERVER)."""
  import kex.tinygrad
  if server: kex.tinygrad.install(server=server)
  else: kex.tinygrad.install()


def train(device=None, steps=300, batch=64, seed=0, lr=3e-3, eval_every=25, progress=False):
  """Train DigitsCNN on `device` (tinygrad's name; None: Device.DEFAULT) for `steps` steps.

  Returns a dict: losses and accuracies (the train batch's, one per step),
  test_accuracy (after the last step, on the held-out 25%), steps, seconds
  (the training loop's wall time, compiles included) and steps_per_s.
  """
  device = Device.canonicalize(device)
  prev_default = Device.DEFAULT
  Device.DEFAULT = device  # the layers' weights are created on the default device
  try:
    np.random.seed(seed)
    rng = np.random.default_rng(seed)
    Tensor.manual_seed(seed)
    X_train, X_test, y_train, y_test = load_digits(seed)
    model = DigitsCNN()
    opt = nn.optim.Adam(nn.state.get_parameters(model), lr=lr)
    Xt, yt = Tensor(X_test, device=device).realize(), Tensor(y_test, device=device).realize()

    @TinyJit
    def train_step(x: Tensor, y: Tensor):
      with Tensor.train():
        opt.zero_grad()
        out = model(x)
        loss = out.sparse_categorical_crossentropy(y).backward()
        opt.step()
        acc = (out.argmax(axis=-1) == y).mean()
        return loss.realize(), acc.realize()

    @TinyJit
    def test_accuracy() -> Tensor:
      return (model(Xt).argmax(axis=-1) == yt).mean().realize()

    losses, accuracies, test_acc = [], [], float("nan")
    bar = None
    if progress:
      from tqdm import tqdm
      bar = tqdm(total=steps, unit="step", dynamic_ncols=True)
    t0 = time.perf_counter()
    for i in range(steps):
      idx = rng.choice(len(X_train), size=batch, replace=False)
      loss, acc = train_step(Tensor(X_train[idx], device=device), Tensor(y_train[idx], device=device))
      losses.append(loss.item())
      accuracies.append(acc.item())
      if bar is not None:
        if (i + 1) % eval_every == 0 or i + 1 == steps: test_acc = test_accuracy().item()
        bar.set_postfix_str(f"loss {losses[-1]:.3f}  acc {accuracies[-1]:.3f}  test {test_acc:.3f}", refresh=False)
        bar.update(1)
    test_acc = test_accuracy().item()
    seconds = time.perf_counter() - t0
    if bar is not None: bar.close()
    return {"losses": losses, "accuracies": accuracies, "test_accuracy": test_acc, "steps": steps,
            "seconds": seconds, "steps_per_s": steps / seconds if seconds > 0 else float("inf")}
  finally:
    Device.DEFAULT = prev_default


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--device", help="tinygrad device (default: Device.DEFAULT; KEX or KEX:<kexd device>: kexd, via kex.tinygrad)")
  ap.add_argument("--server", help="kexd address for --device KEX (default: $KEX_SERVER)")
  ap.add_argument("--steps", type=int, default=300)
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--lr", type=float, default=3e-3)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--quiet", action="store_true", help="no progress bar, only the final line")
  args = ap.parse_args(argv)
  if (args.device or "").split(":")[0].upper() == "KEX" or (args.device is None and os.environ.get("KEX") == "1"):
    install_kex(args.server)
  device = args.device or Device.DEFAULT
  r = train(device, steps=args.steps, batch=args.batch, seed=args.seed, lr=args.lr, progress=not args.quiet)
  print(f"test accuracy {r['test_accuracy']:.3f} ({r['steps']} steps, {r['steps_per_s']:.1f} steps/s)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
