"""The checked value of a cluster.json object (`cluster.jsonmodel.JsonModel.checked`)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from pydantic import Field

from cluster.jsonmodel import JsonModel


class _Section(JsonModel):
    name: str
    size: int = 1
    tags: list[str] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Spec:
    name: str
    size: int
    tags: tuple[str, ...]


def test_the_fields_as_written_but_those_resolved() -> None:
    raw = _Section.model_validate({"name": "a", "tags": ["x", "y"]})
    assert raw.checked(_Spec, tags=tuple(raw.tags)) == _Spec("a", 1, ("x", "y"))


def test_a_field_that_one_side_lacks_is_a_type_error() -> None:
    raw = _Section.model_validate({"name": "a"})
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        raw.checked(_Spec, tags=(), colour="red")

    @dataclass(frozen=True)
    class Narrow:
        name: str

    with pytest.raises(TypeError, match="unexpected keyword argument"):
        raw.checked(Narrow)
