"""The pydantic pieces every cluster.json object is read with: camelCase keys, unknown keys
refused (`JsonModel`) or kept as notes (`LenientModel`), and the shared field types.

`cluster.specfile` reads the common part of the file with them, each engine's `section`
module its own section.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, StrictStr
from pydantic.alias_generators import to_camel

S = TypeVar("S")


class JsonModel(BaseModel):
    """A cluster.json object as written: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, frozen=True)

    def checked(self, spec: Callable[..., S], **resolved: Any) -> S:
        """The checked value `spec` of this object (an engine's section): its fields as
        written, but for those `resolved` (converted, or filled in). `spec` declares the
        same fields: one that either side lacks is a TypeError here, not a value lost."""
        return spec(**{**self.model_dump(), **resolved})


class LenientModel(BaseModel):
    """Batch AI sections: keys we do not use are allowed (reported as notes)."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel, frozen=True)


PositiveInt = Annotated[StrictInt, Field(ge=1)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]


def matching(pattern: re.Pattern[str], what: str) -> AfterValidator:
    """A validator that refuses a string `pattern` does not match: "must be `what`"."""

    def check(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(f"must be {what}")
        return value

    return AfterValidator(check)


def _one_line(value: str) -> str:
    if "\n" in value or "\r" in value or not value.strip():
        raise ValueError("must be one non-empty line")
    return value


OneLine = Annotated[StrictStr, AfterValidator(_one_line)]
