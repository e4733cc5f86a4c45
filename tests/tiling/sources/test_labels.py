"""Label rasters against images (tiling.sources.labels): raw label values to class codes (the uint8
table path gives exactly what the class map's general `apply` gives, and names unknown values
the same way), and the label index that matches images to label rasters."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from affine import Affine
from hypothesis import given, settings
from hypothesis import strategies as st
from rasterio.crs import CRS

from tests.support.labels import pairwise_matches
from tiling.errors import LabelError
from tiling.sources.classes import available_class_maps, get_class_map
from tiling.sources.labels import LabelIndex, footprint_in, label_codes
from tiling.sources.rasters import RasterInfo


def label_info(nodata: float | None) -> RasterInfo:
    return RasterInfo(
        path=str(Path("/labels/lc.tif")),
        crs=CRS.from_epsg(26918),
        transform=Affine.identity(),
        height=1,
        width=1,
        count=1,
        dtype="uint8",
        nodata=nodata,
        block_shape=(1, 1),
        mask_kind="none",
    )


MAPS = [name for name in available_class_maps() if name != "identity"]


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from([*MAPS, "identity"]),
    seed=st.integers(0, 2**32 - 1),
    nodata=st.one_of(st.none(), st.integers(0, 255)),
)
def test_uint8_labels_map_exactly_as_the_class_map_does(
    name: str, seed: int, nodata: int | None
) -> None:
    cmap = get_class_map(name, num_classes=7)
    known = np.array(sorted(cmap.raw_to_code), dtype=np.uint8)
    rng = np.random.default_rng(seed)
    raw = rng.choice(known, size=(37, 53)).astype(np.uint8)
    if nodata is not None:
        raw[rng.random(raw.shape) < 0.2] = nodata  # may be a value the map does not know
    codes = label_codes(raw, label_info(nodata), cmap)
    assert codes.dtype == np.uint8 and codes.flags.writeable
    assert np.array_equal(codes, cmap.apply(raw, nodata=nodata))


def test_identity_of_256_classes_takes_the_general_path_with_the_same_codes() -> None:
    cmap = get_class_map("identity", num_classes=256)
    raw = np.arange(256, dtype=np.uint8).reshape(16, 16)
    assert np.array_equal(label_codes(raw, label_info(None), cmap), raw)
    expected = raw.copy()
    expected[raw == 255] = 0
    assert np.array_equal(label_codes(raw, label_info(255), cmap), expected)


@pytest.mark.parametrize(("nodata", "named"), [(None, "9, 200"), (15, "9, 200"), (9, "200")])
def test_unknown_uint8_values_are_named(nodata: int | None, named: str) -> None:
    cmap = get_class_map("chesapeake7to5")
    raw = np.array([[1, 2, 9], [200, 3, 15]], dtype=np.uint8)  # 15: Chesapeake's nodata
    with pytest.raises(LabelError, match=rf"lc.tif: label values \[{named}\] are not in"):
        label_codes(raw, label_info(nodata), cmap)


def test_a_nodata_value_outside_uint8_is_still_honoured() -> None:
    cmap = get_class_map("chesapeake7to5")
    raw = np.array([[1, -1], [3, -1]], dtype=np.int16)
    codes = label_codes(raw, replace(label_info(-1), dtype="int16"), cmap)
    assert np.array_equal(codes, cmap.apply(np.array([[1, 0], [3, 0]]), nodata=0))


# -- matching images to label rasters -----------------------------------------------------------

UTM18 = CRS.from_epsg(26918)
ALBERS = CRS.from_epsg(5070)


def raster(path: str, crs: CRS, x: float, y: float, size_m: float) -> RasterInfo:
    return RasterInfo(
        path=path, crs=crs, transform=Affine(1, 0, x, 0, -1, y), height=int(size_m),
        width=int(size_m), count=1, dtype="uint8", nodata=None, block_shape=(1, 1),
        mask_kind="none",
    )  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_label_index_matches_exactly_what_the_pairwise_rule_matches(seed: int) -> None:
    """Labels in two CRSs (UTM and Albers), of mixed sizes, some far away, shuffled."""
    rng = np.random.default_rng(seed)
    left, bottom, right, top = footprint_in(raster("a", UTM18, 370_000, 4_300_000, 3000), ALBERS)
    labels = [
        raster(f"u{k}", UTM18, 370_000 + rng.uniform(-2000, 3000), 4_300_000 + rng.uniform(-3000,
               2000), rng.uniform(50, 1500))
        for k in range(12)
    ] + [
        raster(f"a{k}", ALBERS, rng.uniform(left - 2000, right), rng.uniform(bottom, top + 2000),
               rng.uniform(50, 1500))
        for k in range(12)
    ]  # fmt: skip
    labels = [labels[i] for i in rng.permutation(len(labels))]
    index = LabelIndex(labels)
    for k in range(20):
        image = raster(f"i{k}", UTM18, 370_000 + rng.uniform(0, 2500),
                       4_300_000 - rng.uniform(0, 2500), rng.uniform(20, 500))  # fmt: skip
        expected = pairwise_matches(image, labels)
        if expected:
            assert index.match(image) == expected
        else:
            with pytest.raises(LabelError, match="no label raster overlaps it"):
                index.match(image)


def test_matching_transforms_each_image_once_per_label_crs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Thousands of images against thousands of label tiles in two CRSs: one footprint
    transform per image and label CRS, never one per pair, and one transformer per CRS pair."""
    import tiling.sources.crs
    import tiling.sources.labels

    calls = {"footprint": 0}
    real = tiling.sources.labels.footprint_in

    def counting(info: RasterInfo, crs: CRS) -> tuple[float, float, float, float]:
        calls["footprint"] += 1
        return real(info, crs)

    monkeypatch.setattr(tiling.sources.labels, "footprint_in", counting)
    tiling.sources.crs._cached.cache_clear()
    images = [raster(f"i{k}", UTM18, 370_000 + 250 * (k % 50), 4_300_000 - 250 * (k // 50), 256)
              for k in range(2500)]  # fmt: skip
    labels = [raster(f"u{k}", UTM18, 370_000 + 500 * (k % 30), 4_300_000 - 500 * (k // 30), 500)
              for k in range(1500)]  # fmt: skip
    far = [raster(f"a{k}", ALBERS, 10 * k, 0, 5) for k in range(1500)]  # nowhere near
    index = LabelIndex(labels + far)
    matched = [index.match(image) for image in images]
    assert calls["footprint"] == 2 * len(images)
    assert (
        tiling.sources.crs._cached.cache_info().misses == 1
    )  # UTM -> Albers; UTM -> UTM needs none
    assert all(1 <= len(m) <= 4 and all(lab.path.startswith("u") for lab in m) for m in matched)
