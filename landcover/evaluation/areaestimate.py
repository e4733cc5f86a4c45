"""Area and accuracy from a stratified random sample of a map: the estimators of Olofsson et al.
(2014), "Good practices for estimating area and assessing accuracy of land change", Remote
Sensing of Environment 148, 42-57 (eqs. 2-7 there; its section 5 is the worked example the
tests reproduce).

The strata are the map's classes. From the map's pixel count per stratum (`N_i`, weight
`W_i = N_i / N`) and the sample's error matrix of counts (`n_ij`: map class i in rows,
reference class j in columns):

- the estimated area proportion of cell (i, j) is `p_ij = W_i n_ij / n_i`;
- the area of reference class j is `N p_.j`, with standard error
  `sqrt(sum_i W_i^2 (n_ij/n_i)(1 - n_ij/n_i) / (n_i - 1))` (times N);
- user's accuracy of i is `n_ii / n_i`, producer's accuracy of j is `p_jj / p_.j`, overall
  accuracy is `sum_j p_jj`, each with the variance the paper gives.

Pure numpy: no rasters here, so the formulas can be checked on the paper's numbers alone.
Confidence intervals are the estimate ± 1.96 standard errors (the paper's normal
approximation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from landcover.errors import EvaluationError

__all__ = ["Z_95", "AreaEstimate", "ClassEstimate", "estimate_area"]

Z_95 = 1.96  # the paper's multiplier for a 95 % confidence interval
MIN_STRATUM_SAMPLE = 2  # a stratum's variance divides by n_i - 1


@dataclass(frozen=True, slots=True)
class ClassEstimate:
    """One class: its mapped pixels, the estimated area proportion and area (in the unit of
    `pixel_area`) with standard errors, and user's / producer's accuracy with theirs (None
    where the class has no sample points to say it: no stratum, or no reference point)."""

    code: int
    name: str
    mapped_pixels: int
    mapped_area: float  # its stratum's area, in the unit of the areas
    sample_size: int  # points in its stratum (map class)
    proportion: float
    proportion_se: float
    area: float
    area_se: float
    users_accuracy: float | None
    users_accuracy_se: float | None
    producers_accuracy: float | None
    producers_accuracy_se: float | None

    @property
    def area_ci(self) -> tuple[float, float]:
        """The 95 % confidence interval of the area."""
        return (self.area - Z_95 * self.area_se, self.area + Z_95 * self.area_se)

    mapped_proportion: float  # its stratum's weight W_i: its share of the map's area

    def to_json(self) -> dict[str, Any]:
        low, high = self.area_ci
        return {
            "code": self.code,
            "name": self.name,
            "mapped_pixels": self.mapped_pixels,
            "mapped_area": self.mapped_area,
            "mapped_proportion": self.mapped_proportion,
            "sample_size": self.sample_size,
            "proportion": self.proportion,
            "proportion_se": self.proportion_se,
            "area": self.area,
            "area_se": self.area_se,
            "area_ci95": [low, high],
            "users_accuracy": self.users_accuracy,
            "users_accuracy_se": self.users_accuracy_se,
            "producers_accuracy": self.producers_accuracy,
            "producers_accuracy_se": self.producers_accuracy_se,
        }


@dataclass(frozen=True, slots=True)
class AreaEstimate:
    """The estimates of every class, the overall accuracy and the error matrix of estimated
    area proportions (map rows, reference columns; rows sum to the map's weights)."""

    classes: tuple[ClassEstimate, ...]
    counts: npt.NDArray[np.int64]  # the sample's error matrix: map rows x reference columns
    proportions: npt.NDArray[np.float64]  # p_ij
    total_pixels: int
    total_area: float
    pixel_area: float  # the mean area of a mapped pixel
    overall_accuracy: float
    overall_accuracy_se: float

    def to_json(self) -> dict[str, Any]:
        return {
            "total_pixels": self.total_pixels,
            "pixel_area": self.pixel_area,
            "total_area": self.total_area,
            "sample_size": int(self.counts.sum()),
            "overall_accuracy": self.overall_accuracy,
            "overall_accuracy_se": self.overall_accuracy_se,
            "z": Z_95,
            "classes": [c.to_json() for c in self.classes],
            "error_matrix": {
                "rows": "map",
                "columns": "reference",
                "codes": [c.code for c in self.classes],
                "counts": self.counts.tolist(),
                "area_proportions": self.proportions.tolist(),
            },
        }


def estimate_area(
    counts: npt.ArrayLike,
    mapped_pixels: Sequence[int] | npt.ArrayLike,
    *,
    pixel_area: float = 1.0,
    stratum_areas: Sequence[float] | npt.ArrayLike | None = None,
    codes: Sequence[int] | None = None,
    names: Sequence[str] | None = None,
) -> AreaEstimate:
    """Olofsson et al. (2014) estimates from a sample's error matrix `counts` (map class i in
    rows, reference class j in columns, the same classes in the same order) and the map's
    pixel count per class `mapped_pixels`; areas are in the unit of `pixel_area`, or, given
    `stratum_areas` (each class's mapped area, e.g. on the ellipsoid where pixels differ in
    area), in its unit, the strata weighted by those areas.

    Refuses (EvaluationError, one line) a stratum that holds mapped pixels but fewer than two
    sample points (its variance is undefined: an empty stratum), unless its points are all
    its pixels (a census: no sampling variance), and sample points in a stratum with no
    mapped pixel (a sample of another map).
    """
    n = np.asarray(counts, dtype=np.int64)
    mapped = np.asarray(mapped_pixels, dtype=np.int64)
    k = mapped.shape[0]
    if n.shape != (k, k):
        raise ValueError(f"error matrix of shape {n.shape} for {k} classes")
    codes = list(codes) if codes is not None else list(range(1, k + 1))
    names = list(names) if names is not None else [str(c) for c in codes]
    n_i = n.sum(axis=1)
    total = int(mapped.sum())
    if total == 0:
        raise EvaluationError("the map has no classified pixel: nothing to estimate")
    # a stratum whose every pixel is a point (a class of one pixel) is known exactly
    census = (n_i >= mapped) & (mapped > 0)
    for i in range(k):
        if mapped[i] > 0 and n_i[i] < MIN_STRATUM_SAMPLE and not census[i]:
            raise EvaluationError(
                f"stratum {codes[i]} ({names[i]}) covers {int(mapped[i]):,} map pixels but has "
                f"{int(n_i[i])} sample point(s); its variance needs at least "
                f"{MIN_STRATUM_SAMPLE}: draw the sample again with `landcover sample` "
                "(--min-per-class) or label more points of that class"
            )
        if mapped[i] == 0 and n_i[i] > 0:
            raise EvaluationError(
                f"{int(n_i[i])} sample point(s) lie in class {codes[i]} ({names[i]}), which the "
                "map does not hold; the sample was drawn from another map"
            )
    size = (
        mapped * float(pixel_area)
        if stratum_areas is None
        else np.asarray(stratum_areas, dtype=np.float64)
    )
    total_area = float(size.sum())
    weight = size / total_area if total_area > 0 else mapped / total
    strata = n_i > 0  # strata without pixels (and so without points) add nothing
    share = np.zeros((k, k))
    share[strata] = n[strata] / n_i[strata, None]  # n_ij / n_i
    proportions = weight[:, None] * share
    # Var(p_.j) = sum_i W_i^2 s_ij (1 - s_ij) / (n_i - 1)   (eq. 10 of the paper)
    # 1 / (n_i - 1), and 0 for a census stratum: it adds no sampling variance
    inverse = np.where(strata & ~census, 1.0 / np.maximum(n_i - 1, 1), 0.0)
    cell_var = (weight**2)[:, None] * share * (1 - share) * inverse[:, None]
    column = proportions.sum(axis=0)
    column_se = np.sqrt(cell_var.sum(axis=0))
    users = np.diag(share)
    users_var = users * (1 - users) * inverse
    overall = float(np.trace(proportions))
    overall_se = float(np.sqrt(np.sum(weight**2 * users_var)))
    # N_.j estimated: reference pixels of class j (eq. 7's denominator)
    ref_total = (size[:, None] * share).sum(axis=0)
    classes = []
    for j in range(k):
        producers: float | None = None
        producers_se: float | None = None
        if column[j] > 0:
            producers = float(proportions[j, j] / column[j])
            others = sum(
                float(size[i]) ** 2 * share[i, j] * (1 - share[i, j]) * inverse[i]
                for i in range(k)
                if i != j and strata[i]
            )
            own = float(size[j]) ** 2 * (1 - producers) ** 2 * users_var[j]
            producers_se = float(np.sqrt((own + producers**2 * others) / ref_total[j] ** 2))
        classes.append(
            ClassEstimate(
                code=int(codes[j]),
                name=str(names[j]),
                mapped_pixels=int(mapped[j]),
                mapped_area=float(size[j]),
                mapped_proportion=float(weight[j]),
                sample_size=int(n_i[j]),
                proportion=float(column[j]),
                proportion_se=float(column_se[j]),
                area=float(column[j] * total_area),
                area_se=float(column_se[j] * total_area),
                users_accuracy=float(users[j]) if strata[j] else None,
                users_accuracy_se=float(np.sqrt(users_var[j])) if strata[j] else None,
                producers_accuracy=producers,
                producers_accuracy_se=producers_se,
            )
        )
    return AreaEstimate(
        classes=tuple(classes),
        counts=n,
        proportions=proportions,
        total_pixels=total,
        total_area=total_area,
        pixel_area=total_area / total,
        overall_accuracy=overall,
        overall_accuracy_se=overall_se,
    )
