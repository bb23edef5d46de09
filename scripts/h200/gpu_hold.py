"""Allocates GiB of GPU memory with PyTorch, prints READY <pid>, then waits to be killed.

--fork: fork a child after CUDA init that inherits the device files and outlives the parent.
"""
import argparse, os, sys, time

import torch

p = argparse.ArgumentParser()
p.add_argument("--gib", type=float, default=16)
p.add_argument("--fork", action="store_true")
a = p.parse_args()
x = torch.empty(int(a.gib * (1 << 30)), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
if a.fork and os.fork() == 0:
    # The child never touches CUDA: it only keeps the inherited /dev/nvidia* descriptors.
    while True:
        time.sleep(1)
print("READY", os.getpid(), flush=True)
while True:
    time.sleep(1)
