"""The paper's ImageNet protocol: train GateConnect (or a baseline), prune dead blocks, draw the result.

    python examples/imagenet.py --data /data/imagenet --preset imagenet-50-4-32 --gate topk --K 16
    python examples/imagenet.py --data /data/imagenet --gate full --out runs/imagenet-resnext    # Fixed-Full
    python examples/imagenet.py --data /data/imagenet --compile reduce-overhead --workers 16      # on a GPU

--data names the folder holding train/ and val/, each with one folder of images per class (the
validation images sorted into their classes, as torchvision's ImageFolder reads them). The paper's
setting, which follows ResNeXt: a random crop of 8-100% of the image's area (aspect ratio 3/4 to 4/3)
resized to 224x224, colour jitter, PCA lighting noise, per-channel normalisation and a horizontal flip;
the centre 224x224 crop of the image resized to 256 at test; batch 256, weight decay 1e-4, four phases of
30 epochs (gates learned in the first; lr 0.1, 0.1, 0.01, 0.001); K = C/2 by default. The images are read
from disk by DataLoader workers (--workers; default: the CPUs, at most 8). ImageNet has no download.
Ctrl-C, SIGTERM or SIGUSR1 stops it at the next step with a checkpoint;
running the same command again resumes.
"""

import sys

from connlearn.cli import train_script

if __name__ == "__main__":
    sys.exit(train_script("imagenet", __doc__))
