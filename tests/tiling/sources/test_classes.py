"""Class tables and remaps."""

from __future__ import annotations

import numpy as np
import pytest

from tiling.errors import LabelError
from tiling.sources.classes import (
    NODATA_CODE,
    ClassMap,
    available_class_maps,
    get_class_map,
    identity_class_map,
)


def test_chesapeake7to5_folds_impervious_and_nodata() -> None:
    cmap = get_class_map("chesapeake7to5")
    raw = np.array([[1, 2, 3, 4], [5, 6, 15, 0]], dtype=np.uint8)
    assert cmap.apply(raw).tolist() == [[1, 2, 3, 4], [4, 4, 0, 0]]
    assert cmap.num_classes == 5
    assert cmap.class_names[0] == "nodata"


def test_nlcd_maps_forest_water_developed() -> None:
    cmap = get_class_map("nlcd")
    raw = np.array([11, 22, 23, 24, 41, 42, 81, 90, 95, 250], dtype=np.uint8)
    assert cmap.apply(raw).tolist() == [1, 4, 4, 4, 2, 2, 3, 2, 3, 0]


def test_nlcd_developed_open_space_is_low_vegetation() -> None:
    # NLCD 21 is lawn and scattered trees at 1 m (< 20 % impervious), not pavement.
    cmap = get_class_map("nlcd")
    low_vegetation = cmap.class_names.index("low vegetation")
    assert cmap.apply(np.array([21], dtype=np.uint8)).tolist() == [low_vegetation]


def test_raster_nodata_value_becomes_code_zero() -> None:
    cmap = get_class_map("chesapeake7")
    raw = np.array([1, 6, 15], dtype=np.uint8)
    assert cmap.apply(raw, nodata=6).tolist() == [1, NODATA_CODE, NODATA_CODE]


def test_unknown_values_are_named_with_the_fix() -> None:
    cmap = get_class_map("chesapeake7to5")
    with pytest.raises(LabelError, match=r"labels\.tif: label values \[7, 42\] are not in class"):
        cmap.apply(np.array([1, 7, 42, 7], dtype=np.uint8), where="labels.tif")


def test_out_of_range_values_are_rejected() -> None:
    with pytest.raises(LabelError, match=r"0\.\.255"):
        get_class_map("nlcd").apply(np.array([300], dtype=np.int32))


def test_unknown_map_lists_choices() -> None:
    with pytest.raises(LabelError, match="choose one of chesapeake7, chesapeake7to5, nlcd"):
        get_class_map("corine")


def test_identity_map_keeps_codes() -> None:
    cmap = get_class_map("identity", num_classes=4)
    assert cmap.apply(np.array([0, 1, 3], dtype=np.uint8)).tolist() == [0, 1, 3]
    with pytest.raises(LabelError, match=r"\[4\]"):
        cmap.apply(np.array([4], dtype=np.uint8))
    with pytest.raises(LabelError, match=r"2\.\.256"):
        identity_class_map(1)


@pytest.mark.parametrize("name", available_class_maps())
def test_json_round_trip(name: str) -> None:
    cmap = get_class_map(name, num_classes=7)
    again = ClassMap.from_json(cmap.to_json())
    assert again == cmap
    assert np.array_equal(again.lut, cmap.lut)
