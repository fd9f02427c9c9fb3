"""mlp_train.py - train a 2-layer MLP on kexd with the kex Tensor API.

Forward, the gradients written out by hand (no autograd), SGD updates with
assign; the loss goes down.  Needs a kexd with Submit:

    build/daemon/kexd --listen 127.0.0.1:50051 &
    PYTHONPATH=client/python /usr/bin/python3 examples/mlp_train.py 127.0.0.1:50051
"""
import sys

import numpy as np

import kex

addr = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
kex.connect(addr, weight=1)
rng = np.random.default_rng(0)

# data: y = sin(x0) + x1^2 / 4, 256 samples of 2 features
N, D, H = 256, 2, 32
X = rng.uniform(-2, 2, size=(N, D)).astype(np.float32)
Y = (np.sin(X[:, :1]) + X[:, 1:] ** 2 / 4).astype(np.float32)
x, y = kex.tensor(X, upload=True), kex.tensor(Y, upload=True)

# weights live on kexd; assign writes them in place
w1 = kex.tensor((rng.standard_normal((D, H)) / np.sqrt(D)).astype(np.float32))
b1 = kex.tensor(np.zeros((1, H), np.float32))
w2 = kex.tensor((rng.standard_normal((H, 1)) / np.sqrt(H)).astype(np.float32))
b2 = kex.tensor(np.zeros((1, 1), np.float32))
lr = 0.1

for step in range(201):
    # forward
    z1 = x @ w1 + b1                  # (N, H)
    a1 = z1.relu()
    pred = a1 @ w2 + b2               # (N, 1)
    diff = pred - y
    loss = (diff * diff).mean()
    # backward, by hand: d(mean((p-y)^2))/dp = 2(p-y)/N
    g_pred = diff * (2.0 / N)
    g_w2 = a1.T @ g_pred              # (H, 1)
    g_b2 = g_pred.sum(0, keepdim=True)
    g_a1 = g_pred @ w2.T              # (N, H)
    g_z1 = (z1 > 0).where(g_a1, 0.0)
    g_w1 = x.T @ g_z1                 # (D, H)
    g_b1 = g_z1.sum(0, keepdim=True)
    # SGD, all four updates and the loss in one submission
    for w, g in ((w1, g_w1), (b1, g_b1), (w2, g_w2), (b2, g_b2)):
        w.assign(w - g * lr)
    w1.realize(b1, w2, b2, loss)
    if step % 20 == 0:
        print(f"step {step:3d}  loss {loss.item():.5f}")
