"""Staged parts: the format round-trips; a damaged, truncated or foreign part is never trusted."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from tests.support.chipstores import config, sample_part
from tests.tiling.rasters import Scenes
from tiling.runtime.fingerprint import Fingerprint
from tiling.staged import staging_url
from tiling.tiler.parts import decode_part, encode_part, part_key
from tiling.tiler.plan import plan_tiling
from tiling.tiler.staging import PartStaging


@pytest.mark.parametrize("labels", [True, False])
def test_a_part_round_trips_with_absent_chunks_and_exact_sums(labels: bool) -> None:
    part = sample_part(labels=labels)
    back = decode_part(encode_part(part), key=part.key)
    assert (back.source_id, back.key, back.images, back.labels) == (
        7,
        part.key,
        part.images,
        part.labels,
    )
    assert np.array_equal(back.index_rows(), part.index_rows())
    assert back.totals == part.totals  # 2**70 survives: sums are exact integers
    assert back.nbytes() == part.nbytes() == len(b"image-0image-2") + (4 if labels else 0)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda b: b[: len(b) // 2], "checksum"),
        (lambda b: b[:3], "shorter"),
        (lambda b: b[:40] + bytes([b[40] ^ 1]) + b[41:], "checksum"),
    ],
)
def test_a_truncated_or_damaged_part_is_refused(damage: object, reason: str) -> None:
    data = encode_part(sample_part())
    with pytest.raises(ValueError, match=reason):
        decode_part(damage(data), key="k" * 24)  # type: ignore[operator]


def test_a_part_made_for_other_inputs_is_refused() -> None:
    data = encode_part(sample_part(key="a" * 24))
    with pytest.raises(ValueError, match="other inputs or options"):
        decode_part(data, key="b" * 24)


def test_staging_is_beside_the_store_and_ignores_what_it_cannot_trust(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = str(tmp_path / "chips.zarr")
    staging = PartStaging(store)
    assert staging.url == staging_url(store) == f"{store}.parts"
    assert staging.get(7, "k" * 24) is None and staging.names() == frozenset()
    part = sample_part()
    staging.put(part)
    name = PartStaging.name(7, "k" * 24)
    assert staging.names() == {name}
    folder = Path(staging.url)
    assert sorted(p.name for p in folder.iterdir()) == [name]  # no temporary left
    assert staging.get(7, "k" * 24) is not None
    (folder / ".x.part.123.tmp").write_bytes(b"half")  # a writer killed mid-write
    assert staging.names() == {name}
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[:-100])  # a part cut short (no atomic rename)
    with caplog.at_level(logging.WARNING, logger="tiling.tiler.parts"):
        assert staging.get(7, "k" * 24) is None
    assert "staged part ignored (checksum does not match" in caplog.text
    (folder / PartStaging.name(8, "k" * 24)).write_bytes(data)  # another source's part
    assert staging.get(8, "k" * 24) is None
    staging.remove()
    assert not folder.exists()
    staging.remove()  # nothing to remove is fine


def test_the_key_changes_with_the_options_and_with_the_files(
    scenes: Scenes, tmp_path: Path
) -> None:
    plan = plan_tiling(config(scenes.images, tmp_path / "k.zarr"))
    other = plan_tiling(config(scenes.images, tmp_path / "k.zarr", min_valid=0.5))
    source = plan.sources[0]
    fp = {source.image.path: Fingerprint(size=1, modified="1", sample_sha256="a")}
    moved = {source.image.path: Fingerprint(size=1, modified="2", sample_sha256="a")}
    key = part_key(plan.params, source, fp)
    assert key == part_key(plan.params, source, dict(fp))
    assert key != part_key(other.params, source, fp)
    assert key != part_key(plan.params, source, moved)
    assert key != part_key(plan.params, plan.sources[1], fp)
