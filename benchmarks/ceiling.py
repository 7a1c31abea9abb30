"""How much can the choice of connectivity matter? A crossed design on the reduced CIFAR-10 network at K=4:
random connectivities x weight seeds, each seed's starting weights, data order and augmentation shared by
every connectivity, so that the spread splits into what the connectivity explains and what the seed does.

    S=benchmarks/studies/ceiling
    connlearn compare --arms $S/random.toml --seeds 0 1 2 --out $S/results --parallel 2
    connlearn compare --arms $S/balanced.toml --seeds 0 1 2 --out $S/results --parallel 2
    python benchmarks/ceiling.py analyse $S/results
    python benchmarks/ceiling.py complement RUN/last.pt --name NAME --out $S     # then train $S/NAME.toml

The arms train the connectivities of ``$S/connectivities`` from scratch: ``rNN``, Fixed-Random ones (the graph
of ``connlearn.build(gate="random", seed=1000 + NN)`` on the study's network), and ``bNN``, degree-balanced ones
(every branch read by exactly K blocks of the next module).

``complement`` writes a learned run's connectivity and the one it rejected (every block reads the inputs its
gates did not keep: at K = C/2 again a valid K-of-C choice), and an arms file that retrains both beside the
random ones: if learning found information, the complement should do worse.

``analyse`` fits the two-way random-effects model ``top1 = mu + conn + seed + e`` by ANOVA (method of moments)
and prints sigma_conn, sigma_seed and sigma_e with percentile-bootstrap 95% intervals (the connectivity and
the residual resampling connectivities, the seed resampling seeds: resampling both at once, with three seeds,
often repeats one seed and cannot bound sigma_conn below the residual whatever the data), the F-test of
sigma_conn = 0 with the one-sided 95% upper bound on sigma_conn that the decision rule reads, and the
expected best-of-N headroom ``sigma_conn * E[max of N standard normals]`` that picking the best of N
connectivities could give; then another family (``--family``, the balanced ones) against the table's, and
every other arm trained on the same seeds (a learned connectivity, its complement) against the table's mean.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from connlearn.train.compare import collect, paired, read_study


def _toml(comment: str, common: dict[str, Any], arms: dict[str, dict[str, Any]]) -> str:
    """The text of an arms file for ``connlearn compare``: ``common`` options, then a table per arm."""
    lines = [f"# {comment}", *(f"{k} = {json.dumps(v)}" for k, v in common.items()), ""]
    for name, options in arms.items():
        lines += [f"[arms.{name}]", *(f"{k} = {json.dumps(v)}" for k, v in options.items()), ""]
    return "\n".join(lines)


def complement(checkpoint: Path, out: Path, name: str) -> None:
    """A learned run's connectivity and its complement (every block of a gated module reads the inputs its
    gates rejected: at K = C/2 again a K-of-C choice) as frozen graph JSON, ``NAME`` and ``NAME_complement``,
    with the arms file ``out/NAME.toml`` that trains both from scratch."""
    from connlearn.train.checkpoint import load_checkpoint

    data = json.loads(load_checkpoint(checkpoint)["graph"])
    if data["graph"]["gate"] not in ("frozen", "random"):
        raise SystemExit(f"{checkpoint}: its connectivity is not frozen yet ({data['graph']['gate']})")
    learned, rows = json.dumps(data), {}
    for edge in data["edges"]:
        if edge["kind"] == "gate":
            edge["active"] = not edge["active"]
            edge["gate"] = float(edge["active"])
            rows[edge["target"]] = rows.get(edge["target"], 0) + edge["active"]
    if set(rows.values()) != {data["graph"]["K"]}:
        raise SystemExit(f"{checkpoint}: K={data['graph']['K']} is not half of the candidates; the complement "
                         "would read another number of inputs")
    folder = out / "connectivities"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(learned)
    (folder / f"{name}_complement.json").write_text(json.dumps(data))
    common = read_study(out / "random.toml")[0]
    (out / f"{name}.toml").write_text(_toml("the connectivity ceiling (benchmarks/ceiling.py): every arm one "
                                            "connectivity trained from scratch", common, {
        a: {"connectivity": str(folder / f"{a}.json")} for a in (name, f"{name}_complement")}))
    print(f"wrote {name} (the connectivity of {checkpoint}) and {name}_complement to {folder}, and {out / name}.toml")


def mean_squares(table: np.ndarray) -> tuple[float, float, float]:
    """The mean squares ``(connectivities, seeds, residual)`` of a full [connectivities, seeds] table."""
    a, b = table.shape
    grand = table.mean()
    rows, cols = table.mean(axis=1), table.mean(axis=0)
    resid = table - rows[:, None] - cols[None, :] + grand
    return (b * ((rows - grand) ** 2).sum() / (a - 1), a * ((cols - grand) ** 2).sum() / (b - 1),
            (resid ** 2).sum() / ((a - 1) * (b - 1)))


def components(table: np.ndarray) -> tuple[float, float, float]:
    """``(sigma_conn, sigma_seed, sigma_e)`` of a full [connectivities, seeds] table by two-way ANOVA without
    replication (negative variance estimates taken as 0)."""
    a, b = table.shape
    ms_rows, ms_cols, ms_e = mean_squares(table)
    return (math.sqrt(max(0.0, (ms_rows - ms_e) / b)), math.sqrt(max(0.0, (ms_cols - ms_e) / a)), math.sqrt(ms_e))


def conn_test(table: np.ndarray, alpha: float = 0.05) -> tuple[float, float]:
    """``(p, upper)``: the F-test's p-value that the connectivity explains nothing (sigma_conn = 0), and the
    one-sided ``1 - alpha`` upper confidence bound on sigma_conn, by the modified large-sample method for
    ``(MS_conn - MS_e) / seeds`` (Ting, Burdick, Graybill, Jeyaratnam and Lu 1990)."""
    a, b = table.shape
    n1, n2 = a - 1, (a - 1) * (b - 1)
    s1, _, s2 = mean_squares(table)
    h1, g2 = n1 / stats.chi2.ppf(alpha, n1) - 1, 1 - n2 / stats.chi2.ppf(1 - alpha, n2)
    f = stats.f.ppf(alpha, n1, n2)
    h12 = ((1 - f) ** 2 - h1 ** 2 * f ** 2 - g2 ** 2) / f
    upper = (s1 - s2) / b + math.sqrt(h1 ** 2 * s1 ** 2 + g2 ** 2 * s2 ** 2 + h12 * s1 * s2) / b
    return float(stats.f.sf(s1 / s2, n1, n2)), math.sqrt(max(0.0, upper))


def expected_max(n: int, draws: int = 200_000) -> float:
    """E[max of n standard normals], by simulation (fixed seed)."""
    return float(np.random.default_rng(0).standard_normal((draws, n)).max(axis=1).mean())


def versus(table: np.ndarray, other: np.ndarray) -> tuple[float, float, float, float]:
    """Another family of connectivities trained on the same seeds (rows) against the table's, as populations:
    the difference of their seed-averaged means (the seeds' shared part cancels), Welch's 95% interval, p."""
    a, b = table.mean(axis=1), other.mean(axis=1)
    t = stats.ttest_ind(b, a, equal_var=False)
    low, high = t.confidence_interval()
    return float(b.mean() - a.mean()), float(low), float(high), float(t.pvalue)


def analyse(folder: Path, prefix: str, family: str, boots: int) -> str:
    found, _ = collect([folder])
    top1 = {(a, s): run["test_top1"] for a, runs in found.items() for s, run in runs.items()}
    by_arm = {a: set(runs) for a, runs in found.items()}
    arms = sorted(a for a in by_arm if a.startswith(prefix) and len(by_arm[a]) >= 2)  # the crossed part so far
    seeds = sorted(set.intersection(*(by_arm[a] for a in arms))) if arms else []
    if len(arms) < 2 or len(seeds) < 2:
        return f"not yet crossed: {len(arms)} connectivities with 2 seeds or more ({prefix}*)"
    table = np.array([[top1[a, s] for s in seeds] for a in arms])
    conn, seed, e = components(table)
    p, upper = conn_test(table)
    rng = np.random.default_rng(0)  # each factor resampled on its own, the other held as the blocks it is
    by_conn = np.array([components(table[rng.integers(0, len(arms), len(arms))]) for _ in range(boots)])
    by_seed = np.array([components(table[:, rng.integers(0, len(seeds), len(seeds))]) for _ in range(boots)])
    low, high = np.percentile(by_conn, [2.5, 97.5], axis=0)
    low[1], high[1] = np.percentile(by_seed[:, 1], [2.5, 97.5])
    split = "validation" if found[arms[0]][seeds[0]]["run"]["val_split"] else "test"
    lines = [f"{len(arms)} connectivities ({prefix}*) x {len(seeds)} seeds {seeds}; {split} top-1 "
             f"{table.mean():.2f} (range {table.min():.2f} to {table.max():.2f})",
             "| component | sd (points) | bootstrap 95% |", "| --- | --- | --- |"]
    for name, value, lo, hi in zip(("connectivity", "seed", "residual"), (conn, seed, e), low, high, strict=True):
        lines.append(f"| {name} | {value:.2f} | [{lo:.2f}, {hi:.2f}] |")
    lines.append(f"connectivity effect: F-test p = {p:.3g}; one-sided 95% upper bound on sigma_conn {upper:.2f} "
                 "points (modified large-sample)")
    lines += ["", "| connectivity | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |",
              "| --- " * (len(seeds) + 2) + "|",
              *(f"| {a} | " + " | ".join(f"{v:.2f}" for v in row) + f" | {row.mean():.2f} |"
                for a, row in zip(arms, table, strict=True)), ""]
    lines += [f"best-of-{n} headroom: {conn * expected_max(n):.2f} points (sigma_conn x {expected_max(n):.2f}; "
              f"at most {upper * expected_max(n):.2f} at the 95% bound)" for n in (4, 12, 100)]
    means = table.mean(axis=1)
    others = sorted(a for a in by_arm if a.startswith(family) and set(seeds) <= by_arm[a])
    if len(others) >= 2:
        other = np.array([[top1[a, s] for s in seeds] for a in others])
        diff, low, high, p = versus(table, other)
        by_seed = paired(list(other.mean(axis=0) - table.mean(axis=0)), margin=1.0)  # the seeds as the units
        lines.append(f"{len(others)} {family}* connectivities minus the {len(arms)} {prefix}* ones: {diff:+.2f} "
                     f"[{low:+.2f}, {high:+.2f}], p = {p:.2g} (Welch, the connectivities as the units, on these "
                     f"seeds); per seed {', '.join(f'{d:+.2f}' for d in other.mean(axis=0) - table.mean(axis=0))}: "
                     f"[{by_seed['ci'][0]:+.2f}, {by_seed['ci'][1]:+.2f}], p = {by_seed['p']:.2g} (paired over seeds)")
    for probe in sorted(a for a in by_arm if not a.startswith((prefix, family)) and set(seeds) <= by_arm[a]):
        row = np.array([top1[probe, s] for s in seeds])  # another connectivity (learned, its complement, ...)
        t = paired(list(row - table.mean(axis=0)), margin=1.0)
        lines.append(f"{probe}: {row.mean():.2f}, minus the {len(arms)} connectivities' mean on the same seeds "
                     f"{t['mean']:+.2f} [{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}]; above {(means < row.mean()).sum()} of "
                     f"{len(arms)} of them")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("complement", help="a learned run's connectivity and the inputs it rejected, as graph JSON")
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--name", required=True, help="the learned connectivity's arm (the complement's: NAME_complement)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/studies/ceiling"))
    p = sub.add_parser("analyse")
    p.add_argument("folder", type=Path)
    p.add_argument("--prefix", default="r", help="the arms of the table: r (random) or b (degree-balanced)")
    p.add_argument("--family", default="b", help="another family of connectivities to set against the table's")
    p.add_argument("--boots", type=int, default=2000)
    args = parser.parse_args(argv)
    if args.command == "complement":
        complement(args.checkpoint, args.out, args.name)
    else:
        print(analyse(args.folder, args.prefix, args.family, args.boots))


if __name__ == "__main__":
    main()
