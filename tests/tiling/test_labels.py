"""Raw label values to class codes (tiling.labels.label_codes): the uint8 table path gives
exactly what the class map's general `apply` gives, and names unknown values the same way."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from affine import Affine
from hypothesis import given, settings
from hypothesis import strategies as st
from rasterio.crs import CRS

from tiling.classes import available_class_maps, get_class_map
from tiling.errors import LabelError
from tiling.labels import label_codes
from tiling.sources import RasterInfo


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
