"""UCR/UEA time-series classification sets, read from the files the ``aeon`` package ships in its wheel (no
download) as :class:`~connlearn.train.data.ArrayDataset` splits: ``connlearn pack ucr:NAME``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from connlearn.errors import DataError, check_choice
from connlearn.train.data import ArrayDataset


def ucr_sets() -> list[str]:
    """The UCR/UEA classification sets the installed ``aeon`` package ships inside its wheel (no download)."""
    root = _aeon_data()
    return sorted(d.name for d in root.iterdir() if (d / f"{d.name}_TRAIN.ts").is_file()
                  and (d / f"{d.name}_TEST.ts").is_file() and _classification(d / f"{d.name}_TRAIN.ts"))


def _classification(path: Path) -> bool:
    """Whether a .ts file's header says its series have class labels (not regression targets)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.lower().startswith("@data"):
                return False
            if line.lower().split()[:2] == ["@classlabel", "true"]:
                return True
    return False


def _aeon_data() -> Path:
    try:
        import aeon.datasets
    except ImportError:
        raise DataError("the UCR/UEA sets come with the aeon package: pip install 'connlearn[timeseries]' (or "
                        "pip install aeon)") from None
    return Path(aeon.datasets.__file__).parent / "data"


def load_ucr(name: str) -> tuple[ArrayDataset, ArrayDataset]:
    """``(train, test)`` of a UCR/UEA time-series classification set that ``aeon`` ships (:func:`ucr_sets`:
    GunPoint, ArrowHead, ItalyPowerDemand, BasicMotions, JapaneseVowels, OSULeaf, ...) as the archive splits
    it. Series of unequal length are padded with zeros at their end to the longest of both splits (the UEA
    archive's JapaneseVowels: 29); class names are the archive's labels, in natural order."""
    from aeon.datasets import load_from_ts_file

    root = _aeon_data() / check_choice("UCR/UEA set (shipped with aeon)", name, ucr_sets())
    splits = [load_from_ts_file(str(root / f"{name}_{split}.ts")) for split in ("TRAIN", "TEST")]
    length = max(x.shape[-1] for xs, _ in splits for x in xs)
    labels = sorted({str(v) for _, y in splits for v in y}, key=lambda v: (not v.isdigit(), int(v) if v.isdigit()
                                                                          else 0, v))
    index = {v: i for i, v in enumerate(labels)}
    out = []
    for xs, y in splits:
        x = np.zeros((len(xs), xs[0].shape[0], length), dtype=np.float32)
        for i, series in enumerate(xs):
            x[i, :, :series.shape[-1]] = np.nan_to_num(np.asarray(series, dtype=np.float32))
        out.append(ArrayDataset(x, [index[str(v)] for v in y], labels))
    return out[0], out[1]
