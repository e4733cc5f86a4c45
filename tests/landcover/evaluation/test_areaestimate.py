"""The stratified estimators against the worked example of Olofsson et al. (2014), section 5
(Tables 8 and 9 and the estimates printed beside them), and a coverage simulation: over many
stratified samples of a map whose truth is known, the 95 % intervals cover the true areas
about 95 % of the time."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from landcover.errors import EvaluationError
from landcover.evaluation.areaestimate import Z_95, estimate_area

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"

# Table 8: the sample's error matrix in counts, map classes in rows, reference in columns.
NAMES = ("deforestation", "forest gain", "stable forest", "stable non-forest")
COUNTS = [[66, 0, 5, 4], [0, 55, 8, 12], [1, 0, 153, 11], [2, 1, 9, 313]]
MAPPED_PX = [200_000, 150_000, 3_200_000, 6_450_000]
PIXEL_HA = 0.09  # 30 m Landsat pixels

# As printed in the paper (hectares to the unit, accuracies to two decimals, Table 9 to four).
PAPER_AREA_HA = [21_158, 11_686, 285_770, 581_386]
PAPER_AREA_CI_HA = [6_158, 3_756, 15_510, 16_282]
PAPER_USERS = [0.88, 0.73, 0.93, 0.96]
PAPER_USERS_CI = [0.07, 0.10, 0.04, 0.02]
PAPER_PRODUCERS = [0.75, 0.85, 0.93, 0.96]
PAPER_PRODUCERS_CI = [0.21, 0.25, 0.03, 0.02]
PAPER_OVERALL, PAPER_OVERALL_CI = 0.95, 0.02
PAPER_TABLE9 = [
    [0.0176, 0.0000, 0.0013, 0.0011],
    [0.0000, 0.0110, 0.0016, 0.0024],
    [0.0019, 0.0000, 0.2967, 0.0213],
    [0.0040, 0.0020, 0.0179, 0.6212],
]
PAPER_TABLE9_COLUMNS = [0.0235, 0.0130, 0.3175, 0.6460]


def test_the_worked_example_of_olofsson_2014_reproduces_to_its_rounding() -> None:
    e = estimate_area(COUNTS, MAPPED_PX, pixel_area=PIXEL_HA, names=NAMES)
    assert [round(c.area) for c in e.classes] == PAPER_AREA_HA
    assert [round(Z_95 * c.area_se) for c in e.classes] == PAPER_AREA_CI_HA
    assert [round(c.users_accuracy or -1, 2) for c in e.classes] == PAPER_USERS
    assert [round(Z_95 * (c.users_accuracy_se or -1), 2) for c in e.classes] == PAPER_USERS_CI
    assert [round(c.producers_accuracy or -1, 2) for c in e.classes] == PAPER_PRODUCERS
    assert [
        round(Z_95 * (c.producers_accuracy_se or -1), 2) for c in e.classes
    ] == PAPER_PRODUCERS_CI
    assert round(e.overall_accuracy, 2) == PAPER_OVERALL
    assert round(Z_95 * e.overall_accuracy_se, 2) == PAPER_OVERALL_CI
    assert np.round(e.proportions, 4).tolist() == PAPER_TABLE9
    assert [round(c.proportion, 4) for c in e.classes] == PAPER_TABLE9_COLUMNS
    # the rows of Table 9 are the map's weights
    assert np.allclose(e.proportions.sum(axis=1), np.array(MAPPED_PX) / sum(MAPPED_PX))
    low, high = e.classes[0].area_ci
    assert abs((high - low) - 2 * PAPER_AREA_CI_HA[0]) < 1


def test_the_json_holds_every_estimate_and_the_matrix() -> None:
    e = estimate_area(COUNTS, MAPPED_PX, pixel_area=PIXEL_HA, names=NAMES, codes=[1, 2, 3, 4])
    doc = e.to_json()
    assert doc["sample_size"] == 640
    assert doc["error_matrix"]["counts"] == COUNTS
    first = doc["classes"][0]
    assert first["name"] == "deforestation" and first["sample_size"] == 75
    assert first["mapped_proportion"] == pytest.approx(0.02)
    assert first["area_ci95"][0] < first["area"] < first["area_ci95"][1]


@pytest.mark.parametrize(
    ("counts", "mapped", "message"),
    [
        ([[5, 1], [0, 1]], [100, 50], "stratum 2 (b) covers 50 map pixels but has 1 sample"),
        ([[5, 1], [0, 0]], [100, 50], "stratum 2 (b) covers 50 map pixels but has 0 sample"),
        ([[5, 1], [2, 2]], [100, 0], "4 sample point(s) lie in class 2 (b), which the map"),
        ([[0, 0], [0, 0]], [0, 0], "no classified pixel"),
    ],
)
def test_an_empty_stratum_or_a_sample_of_another_map_is_refused(
    counts: list[list[int]], mapped: list[int], message: str
) -> None:
    with pytest.raises(EvaluationError, match=None) as caught:
        estimate_area(counts, mapped, names=["a", "b"])
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_class_without_mapped_pixels_still_gets_its_estimated_area() -> None:
    """Reference points of a class the map never shows: its area comes from omission alone,
    and it has no user's accuracy."""
    e = estimate_area([[7, 2, 1], [1, 8, 1], [0, 0, 0]], [500, 500, 0], names="abc")
    c = e.classes[2]
    assert c.users_accuracy is None and c.producers_accuracy == 0
    assert c.proportion == pytest.approx(0.5 * 0.1 + 0.5 * 0.1)
    assert e.classes[1].proportion == pytest.approx(0.5 * 0.2 + 0.5 * 0.8)
    assert sum(x.proportion for x in e.classes) == pytest.approx(1.0)


def load_bench_area() -> ModuleType:
    """benchmarks/bench_area.py, the one owner of the coverage simulation."""
    sys.path.insert(0, str(BENCHMARKS))  # the bench imports its sibling resultfile.py
    try:
        spec = importlib.util.spec_from_file_location("bench_area", BENCHMARKS / "bench_area.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_area"] = module  # its dataclass looks its module up there
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_intervals_cover_the_true_areas_95_percent_of_the_time(seed: int) -> None:
    """1,000 stratified samples of a map with known truth (benchmarks/bench_area.py), at any
    seed. Over the classes the intervals cover 95 % ± 2 %. Each class stays within 95 % ± 3.5 %:
    the normal approximation covers the rarest class less (about 93 %), since its omission
    errors in the large strata are a few points of a skewed count (Olofsson et al. 2014 use
    the same intervals), and 1,000 draws add ±1.4 % of binomial noise."""
    simulation = load_bench_area().simulate(draws=1_000, seed=seed)
    assert abs(simulation.coverage.mean() - 0.95) <= 0.02, simulation.coverage
    assert np.all(np.abs(simulation.coverage - 0.95) <= 0.035), simulation.coverage
    # the map's own pixel counts are biased where its errors are; the estimates are not
    mapped_error = np.abs(simulation.mapped_px / simulation.true_px - 1)
    estimate_error = np.abs(simulation.mean_estimate_px / simulation.true_px - 1)
    assert estimate_error.max() < mapped_error.max()
