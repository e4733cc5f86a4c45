"""What the model side adds to the class tables (`landcover.classes`)."""

from __future__ import annotations

import numpy as np
import pytest

from landcover.classes import unknown_codes
from tiling.sources.classes import get_class_map

FIVE = get_class_map("chesapeake7to5")  # codes 0-4


def test_codes_of_the_table_are_not_unknown() -> None:
    codes = np.array([[0, 1, 2], [3, 4, 4]], dtype=np.uint8)
    assert unknown_codes(codes, FIVE) is None
    assert unknown_codes(np.zeros((0, 3), dtype=np.uint8), FIVE) is None


def test_unknown_codes_are_listed_once_each_lowest_first_at_most_eight() -> None:
    codes = np.array([[9, 1, 5], [255, 9, 0]], dtype=np.uint8)
    assert unknown_codes(codes, FIVE) == (
        "holds class codes 5, 9, 255 outside its class table 'chesapeake7to5' (codes 0-4)"
    )
    many = np.arange(5, 20, dtype=np.uint8).reshape(3, 5)
    text = unknown_codes(many, FIVE, table="the assumed table")
    assert (
        text == "holds class codes 5, 6, 7, 8, 9, 10, 11, 12 outside the assumed table (codes 0-4)"
    )


@pytest.mark.parametrize("code", [5, 200])
def test_one_code_past_the_table_is_unknown(code: int) -> None:
    codes = np.full((2, 2), 1, dtype=np.uint8)
    codes[1, 1] = code
    assert unknown_codes(codes, FIVE) == (
        f"holds class codes {code} outside its class table 'chesapeake7to5' (codes 0-4)"
    )
