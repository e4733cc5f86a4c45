"""Area estimates from a stratified sample (`landcover evaluate --reference`) against the map's
own pixel counts, on a synthetic map whose truth is known.

The map has 60,000 pixels in 4 classes whose errors differ by class (a rare class mapped at
80 % user's accuracy, a common one at 93 %). Each draw takes a stratified random sample (100,
100, 150 and 200 points per class, as `landcover sample --per-class` would), labels it from
the truth and estimates each class's area with its 95 % confidence interval (Olofsson et al.
2014, `landcover.evaluation.areaestimate`). Over DRAWS draws it prints, per class: the true
area, the mapped area (what counting the map's pixels says), the mean estimate, and how often
the interval covered the true area (95 % is the promise).

Usage: python benchmarks/bench_area.py [--draws N] [--seed S] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resultfile import recording_tables

from landcover.evaluation.areaestimate import estimate_area

MAPPED_PX = (3_000, 6_000, 21_000, 30_000)
PER_STRATUM = (100, 100, 150, 200)
# Each map class's pixels carry truth drawn from its own row (map class i, truth j).
CONFUSION = np.array(
    [
        [0.80, 0.05, 0.10, 0.05],
        [0.05, 0.85, 0.05, 0.05],
        [0.02, 0.03, 0.90, 0.05],
        [0.01, 0.02, 0.04, 0.93],
    ]
)


@dataclass(frozen=True)
class Simulation:
    """Per class (in pixels): the truth, the map, the mean estimate over the draws and the
    share of draws whose 95 % interval held the true area."""

    true_px: npt.NDArray[np.int64]
    mapped_px: npt.NDArray[np.int64]
    mean_estimate_px: npt.NDArray[np.float64]
    coverage: npt.NDArray[np.float64]
    draws: int


def simulate(draws: int, seed: int) -> Simulation:
    """`draws` stratified samples of the synthetic map (module docstring), seeded."""
    rng = np.random.default_rng(seed)
    k = len(MAPPED_PX)
    mapped_px = np.array(MAPPED_PX, dtype=np.int64)
    truth = np.concatenate([rng.choice(k, size=n, p=CONFUSION[i]) for i, n in enumerate(MAPPED_PX)])
    true_px = np.bincount(truth, minlength=k)
    starts = np.concatenate([[0], np.cumsum(mapped_px)[:-1]])
    covered = np.zeros(k)
    total = np.zeros(k)
    for _ in range(draws):
        counts = np.zeros((k, k), dtype=np.int64)
        for i in range(k):
            picks = starts[i] + rng.choice(mapped_px[i], size=PER_STRATUM[i], replace=False)
            counts[i] = np.bincount(truth[picks], minlength=k)
        estimate = estimate_area(counts, mapped_px)
        for j, c in enumerate(estimate.classes):
            low, high = c.area_ci
            covered[j] += low <= true_px[j] <= high
            total[j] += c.area
    return Simulation(true_px, mapped_px, total / draws, covered / draws, draws)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sim = simulate(args.draws, args.seed)
    print(f"{sim.draws:,} stratified samples; a 95 % interval should cover 95 % of the time\n")
    print("## CI coverage\n")
    print("| class | true px | mapped px | mapped / true | mean estimate / true | coverage % |")
    print("|---|---:|---:|---:|---:|---:|")
    for j in range(len(MAPPED_PX)):
        true = sim.true_px[j]
        print(
            f"| {j + 1} | {true:,} | {sim.mapped_px[j]:,} | {sim.mapped_px[j] / true:.3f} | "
            f"{sim.mean_estimate_px[j] / true:.3f} | {100 * sim.coverage[j]:.1f} |"
        )


if __name__ == "__main__":
    with recording_tables("bench_area.py"):
        main()
