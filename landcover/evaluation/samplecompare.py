"""Scoring a map against a labelled stratified sample (`landcover evaluate --reference`): the
map's pixels per class are counted block by block (the strata), each point's map class is
read from the map under it, its reference comes from the sample's `reference` column or from
a truth raster, and the error matrix of counts goes to the estimators of
`landcover.evaluation.areaestimate`.

The map is the authority on the strata: a point that lies outside the map or on its nodata
is refused (the sample was drawn from another map).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio

from landcover.errors import EvaluationError
from landcover.evaluation.areaestimate import AreaEstimate, estimate_area
from landcover.evaluation.config import EvaluateConfig
from landcover.evaluation.referencesample import (
    MAP_CODE_COLUMN,
    ReferenceSample,
    parse_references,
    read_reference_sample,
    references_from_raster,
    sample_in_crs,
)
from landcover.evaluation.sampling import count_map_classes, open_maps, values_at
from landcover.view.mapfile import MapFile
from tiling.errors import TilingError
from tiling.sources.classes import NODATA_CODE, ClassMap, get_class_map

__all__ = ["SampleEvaluation", "evaluate_sample"]

logger = logging.getLogger(__name__)

M2_PER_KM2 = 1e6


@dataclass(frozen=True, slots=True)
class SampleEvaluation:
    """Area and accuracy estimates of a map from a labelled sample (areas in km²)."""

    prediction: str
    reference: str
    reference_raster: str | None
    class_map: ClassMap
    estimate: AreaEstimate
    points_without_reference: int  # points the truth raster left unlabelled (dropped)

    def to_json(self) -> dict[str, Any]:
        doc = self.estimate.to_json()
        return {
            "kind": "stratified-sample",
            "method": "Olofsson et al. 2014, Remote Sensing of Environment 148, 42-57",
            "prediction": self.prediction,
            "reference": self.reference,
            "reference_raster": self.reference_raster,
            "class_map": self.class_map.name,
            "area_unit": "km2",
            "points_without_reference": self.points_without_reference,
            **doc,
        }


def evaluate_sample(config: EvaluateConfig) -> SampleEvaluation:
    """Estimates for `config.prediction` from the sample `config.reference` (see the module
    docstring)."""
    assert config.reference is not None  # EvaluateConfig refuses the other cases
    (m,) = open_maps([config.prediction])
    class_map = m.class_map
    sample = read_reference_sample(config.reference)
    if len(sample) == 0:
        raise EvaluationError(f"--reference {config.reference}: holds no points")
    crs_wkt = m.crs.to_wkt()
    x, y = sample_in_crs(sample, crs_wkt)
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    with rasterio.Env(GDAL_CACHEMAX=64 * 1024 * 1024):
        map_codes = _map_codes_at(m, xs, ys, config.reference)
        _check_sample_of(m, sample, map_codes)
        if config.reference_raster is not None:
            truth_map = _truth_class_map(config.class_map, class_map)
            references = references_from_raster(xs, ys, crs_wkt, config.reference_raster, truth_map)
        else:
            references = parse_references(sample, class_map)
        area_m2 = np.zeros(class_map.num_classes)
        mapped = count_map_classes([m], area_m2=area_m2).sum(axis=0)
    labelled = references != NODATA_CODE
    dropped = int((~labelled).sum())
    if dropped:
        logger.warning(
            "%d of %d points fall on the truth raster's nodata (or outside it) and are left out",
            dropped,
            len(references),
        )
    k = class_map.num_classes
    counts = np.zeros((k - 1, k - 1), dtype=np.int64)
    np.add.at(counts, (map_codes[labelled] - 1, references[labelled] - 1), 1)
    estimate = estimate_area(
        counts,
        mapped[1:],
        stratum_areas=area_m2[1:] / M2_PER_KM2,
        codes=[c.code for c in class_map.classes[1:]],
        names=class_map.class_names[1:],
    )
    return SampleEvaluation(
        prediction=config.prediction,
        reference=config.reference,
        reference_raster=config.reference_raster,
        class_map=class_map,
        estimate=estimate,
        points_without_reference=dropped,
    )


def _map_codes_at(
    m: MapFile, xs: npt.NDArray[np.float64], ys: npt.NDArray[np.float64], reference: str
) -> npt.NDArray[np.int64]:
    """The map's class under each point; refuses points off the map or on its nodata."""
    rows, cols = rasterio.transform.rowcol(m.transform, xs, ys)
    rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
    inside = (rows >= 0) & (rows < m.height) & (cols >= 0) & (cols < m.width)
    codes = np.zeros(len(xs), dtype=np.int64)
    with rasterio.open(m.path) as ds:
        codes[inside] = values_at(ds, rows[inside], cols[inside])
    pixel = rows.astype(np.int64) * m.width + cols
    _, first, seen = np.unique(pixel[inside], return_index=True, return_counts=True)
    if (seen > 1).any():
        where = np.flatnonzero(inside)
        twice = where[first[np.argmax(seen > 1)]]
        again = where[np.flatnonzero(pixel[inside] == pixel[twice])[1]]
        raise EvaluationError(
            f"--reference {reference}: rows {int(twice) + 1} and {int(again) + 1} are the same "
            f"pixel of {m.given} (a stratified sample draws a pixel once); remove the "
            "duplicate"
        )
    off = np.flatnonzero(codes == NODATA_CODE)
    if off.size:
        raise EvaluationError(
            f"--reference {reference}: {off.size} of {len(xs)} points lie outside "
            f"{m.given} or on its nodata (first: row {int(off[0]) + 1}); the sample was "
            "drawn from another map: draw it from this one with `landcover sample`"
        )
    outside_table = np.flatnonzero(codes >= m.class_map.num_classes)
    if outside_table.size:
        raise EvaluationError(
            f"{m.given}: holds class code {int(codes[outside_table[0]])} outside its class "
            f"table {m.class_map.name!r}"
        )
    return codes


def _check_sample_of(m: MapFile, sample: ReferenceSample, codes: npt.NDArray[np.int64]) -> None:
    """Refuse a sample whose `map_code` column disagrees with the map under its points: it
    was drawn from another map, so its strata are not this map's."""
    if sample.map_codes is None:
        return
    given = np.array([int(c) if c.isdigit() else -1 for c in sample.map_codes], dtype=np.int64)
    wrong = np.flatnonzero((given != codes) & (given >= 0))
    if wrong.size:
        i = int(wrong[0])
        raise EvaluationError(
            f"--reference {sample.path}: {wrong.size} of {len(codes)} points have a "
            f"{MAP_CODE_COLUMN} other than the class of {m.given} under them (first: row "
            f"{i + 1}, {MAP_CODE_COLUMN} {int(given[i])}, the map {int(codes[i])}); the sample "
            "was drawn from another map: evaluate that map, or draw a sample of this one"
        )


def _truth_class_map(name: str | None, map_class_map: ClassMap) -> ClassMap:
    k = map_class_map.num_classes
    try:
        truth = map_class_map if name is None else get_class_map(name, num_classes=k)
    except TilingError as exc:
        raise EvaluationError(str(exc)) from None
    if truth.num_classes != k:
        raise EvaluationError(
            f"--class-map {truth.name} has {truth.num_classes - 1} classes but the map's table "
            f"{map_class_map.name!r} has {k - 1}; choose a class map onto the same classes"
        )
    return truth
