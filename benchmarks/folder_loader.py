"""Images per second of the ImageNet folder loader (``connlearn.train.loaders.FolderLoader``), without a model.

It writes ``--images`` generated JPEGs of ImageNet's typical size (500x375, quality 90) into a temporary
folder of 10 classes, then times one training epoch (random-area crop to 224, colour jitter, lighting,
normalisation, flip) and one evaluation epoch (resize to 256, centre crop 224) for each worker count,
after one untimed pass that warms the file cache. With ``--repeats N`` each time is the median of N.
Every epoch starts its workers anew, as in training. Compare the images/s per core (several workers on
as many cores) with the images/s a training step needs, to size ``--workers``.

    python benchmarks/folder_loader.py --images 512 --workers 0 1 2 --repeats 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from connlearn.train.data import image_files
from connlearn.train.loaders import FolderLoader


def write_images(root: Path, count: int, size: tuple[int, int] = (500, 375), classes: int = 10) -> None:
    """``count`` JPEGs of smooth random colour fields (which compress like photographs, unlike noise)."""
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"class{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        coarse = rng.integers(0, 256, (size[1] // 25, size[0] // 25, 3), dtype=np.uint8)
        Image.fromarray(coarse).resize(size, Image.BICUBIC).save(folder / f"{i:06d}.jpg", quality=90)


def images_per_second(loader: FolderLoader, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        seen = sum(len(y) for _, y in loader.epoch(0))
        times.append(seen / (time.perf_counter() - t0))
    return statistics.median(times), times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    results = {"date": date.today().isoformat(), "machine": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "torch": torch.__version__, "images": args.images,
               "batch_size": args.batch_size, "repeats": args.repeats, "runs": []}
    with tempfile.TemporaryDirectory() as folder:
        write_images(Path(folder), args.images)
        files = image_files(folder)
        for workers in args.workers:
            for train in (True, False):
                loader = FolderLoader(files, args.batch_size, train=train, num_workers=workers, drop_last=False)
                sum(len(y) for _, y in loader.epoch(0))  # warms the file cache and the workers' imports
                median, each = images_per_second(loader, args.repeats)
                results["runs"].append({"workers": workers, "train": train, "images_per_s": median,
                                        "images_per_s_each": each})
                print(f"workers={workers} {'train' if train else 'eval '}: {median:7.1f} images/s "
                      f"({', '.join(f'{t:.1f}' for t in each)})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
