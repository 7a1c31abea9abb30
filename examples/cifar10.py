"""The paper's CIFAR-10 protocol: train GateConnect (or a baseline), prune dead blocks, draw the result.

    python examples/cifar10.py --preset cifar-29-8-8 --gate topk --K 4            # the full 320 epochs
    python examples/cifar10.py --epochs 30 --out runs/cifar10-short                   # the schedule scaled to 30
    python examples/cifar10.py --gate full --out runs/cifar10-resnext                 # Fixed-Full (ResNeXt)

Data: --data PATH, else the first of $CONNLEARN_DATA, ./data, ../shared/data and ~/.cache/connlearn that holds
it, else torchvision's download into the cache; without any, it stops with one line saying where it looked
(--synthetic trains on a generated stand-in instead). Ctrl-C, SIGTERM or SIGUSR1 stops it at the next step with
a checkpoint; running the same command again resumes. At the end it prints its total time.
"""

import sys
import time

from connlearn.cli import train_script

if __name__ == "__main__":
    start = time.perf_counter()
    code = train_script("cifar10", __doc__)
    if code == 0:
        print(f"total time: {(time.perf_counter() - start) / 60:.1f} min (data, training, pruning and pictures)")
    sys.exit(code)
