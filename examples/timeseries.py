"""A gated 1-D ResNeXt on UCR time-series sets: Fixed-Full, Fixed-Random and learned connectivity (``magnitude``,
the kind that came closest to Fixed-Random in the estimator study), paired over seeds, beside published
accuracies of Wang, Yan and Oates's 1-D ResNet and of InceptionTime on the same sets.

    pip install 'connlearn[timeseries]'          # aeon: the sets ship inside its wheel, no download
    python examples/timeseries.py --out runs/timeseries --seeds 0 1 2 3 4
    python examples/timeseries.py --sets BasicMotions OSULeaf     # any sets aeon ships: connlearn.train.data.ucr_sets()

For each set, its train/test split as the archive gives it is packed once (``connlearn pack ucr:NAME``), and
``connlearn compare`` trains every arm x seed (each run a resumable ``connlearn train`` folder) on the packed
arrays, each channel standardised by the training set's mean and std over its series and time steps (the
archive's series are z-normalised already), evaluated on the test split after the last epoch. The table goes
to ``OUT/results.md``.
"""

import argparse
import json
import sys
from pathlib import Path

from connlearn.cli import main as connlearn

SETS = ("GunPoint", "ItalyPowerDemand", "ArrowHead")
ARMS = ("full gate=full", "random gate=random K=4", "learned gate=magnitude K=4")
NETWORK = ["--M", "3", "--C", "8", "--width", "2", "--base-channels", "16", "--stem-channels", "16"]
#: test accuracy (%) published for each set: Wang et al. (2017)'s ResNet, mean of 10 runs as re-run by Fawaz et
#: al. (2019), github.com/hfawaz/dl-4-tsc results/results-uea-avg-std.csv (e0233ef); InceptionTime (Fawaz et al.
#: 2020), github.com/hfawaz/InceptionTime results-InceptionTime-85.csv (952d115)
PUBLISHED = {"GunPoint": (99.1, 100.0), "ItalyPowerDemand": (96.3, 96.8), "ArrowHead": (84.5, 82.9)}


def run(out: Path, sets: list[str], seeds: list[str], epochs: int, parallel: int) -> None:
    rows = ["| set | Fixed-Full | Fixed-Random | learned (magnitude) | learned − Fixed-Random, paired | ResNet "
            "(Wang et al.) | InceptionTime |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in sets:
        data = out / "data" / f"{name}.npz"
        if not data.exists() and connlearn(["pack", f"ucr:{name}", "-o", str(data)]):
            sys.exit(1)  # an unknown set: connlearn said which sets there are
        arms = [a for arm in ARMS for a in ("--arm", arm)]
        connlearn(["compare", *arms, "--baseline", "random", "--seeds", *seeds, "--dataset", "custom", "--data",
                   str(data), "--epochs", str(epochs), "--batch-size", "16", "--eval-every", str(epochs),
                   *NETWORK, "--no-progress", "--parallel", str(parallel), "--out", str(out / name)])
        report = json.loads((out / name / "report.json").read_text())
        arm, test = report["arms"], report["against"]["learned"]
        cells = [f"{arm[a]['mean']:.1f} ± {arm[a]['sd'] or 0:.1f}" for a in ("full", "random", "learned")]
        ci = test.get("ci", [float("nan")] * 2)
        published = [f"{v:.1f}" for v in PUBLISHED[name]] if name in PUBLISHED else ["n/a", "n/a"]
        rows.append(f"| {name} | {' | '.join(cells)} | {test['mean']:+.1f} [{ci[0]:+.1f}, {ci[1]:+.1f}] | "
                    f"{' | '.join(published)} |")
    table = "\n".join(rows) + "\n"
    (out / "results.md").write_text(table)
    print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/timeseries"))
    parser.add_argument("--sets", nargs="+", default=list(SETS), metavar="NAME",
                        help=f"UCR/UEA sets that aeon ships (default {' '.join(SETS)})")
    parser.add_argument("--seeds", nargs="+", default=["0", "1", "2", "3", "4"])
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=1)
    args = parser.parse_args()
    run(args.out, args.sets, args.seeds, args.epochs, args.parallel)
