"""The paper's Mini-ImageNet protocol: train GateConnect (or a baseline), prune dead blocks, draw the result.

    connlearn pack FOLDER --size 84 --test-per-class 100 -o miniimagenet.npz    # once: FOLDER/<class>/*.jpg
    python examples/miniimagenet.py --data miniimagenet.npz --preset miniimagenet-29-8-8 --gate topk --K 4
    python examples/miniimagenet.py --data miniimagenet.npz --epochs 30 --out runs/mini-short
    python examples/miniimagenet.py --data miniimagenet.npz --gate full --out runs/mini-resnext   # Fixed-Full

The paper's setting: 100 classes of 600 images (500 to train, 100 to test) resized to 84x84; a random
64x64 crop or its mirror image with the per-pixel mean subtracted, the centre crop at test; batch 256,
weight decay 5e-4, four phases of 320 epochs in all (the paper gives only the total and calls them
similar to CIFAR's; the 120/100/50/50 split and its learning rates are CIFAR's); the CIFAR architectures
with a max-pool after the stem. Mini-ImageNet has no download: pack its images once (above), then pass --data or
set $CONNLEARN_DATA; without them it stops with one line saying where it looked.
Ctrl-C, SIGTERM or SIGUSR1 stops it at the next step with a checkpoint;
running the same command again resumes.
"""

import sys

from connlearn.cli import train_script

if __name__ == "__main__":
    sys.exit(train_script("miniimagenet", __doc__))
