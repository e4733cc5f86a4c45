"""The staging area of a distributed prediction (landcover.prediction.parts): part keys, the
record that commits a part, and what a reader refuses to trust."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from landcover.prediction.parts import CLASSES, RECORD, PartRecord, PartWriter, Staging, part_key
from landcover.prediction.ranks import RankShare
from tiling.runtime.fingerprint import Fingerprint

MODEL = Fingerprint(size=10, modified="1", sample_sha256="a" * 64)
IMAGE = Fingerprint(size=20, modified="2", sample_sha256="b" * 64)
SHARE = RankShare(1, 64, 128)
SETTINGS = {"block_px": 64, "tta": "none"}


def key(**changes: object) -> str:
    args: dict[str, object] = {
        "settings": SETTINGS,
        "model": MODEL,
        "images": [("a.tif", IMAGE)],
        "share": SHARE,
        "world_size": 2,
    }
    args.update(changes)
    return part_key(**args)  # type: ignore[arg-type]


def test_the_key_changes_with_everything_a_part_depends_on() -> None:
    keys = {
        key(),
        key(settings={**SETTINGS, "tta": "d4"}),
        key(model=Fingerprint(size=10, modified="9", sample_sha256="a" * 64)),
        key(images=[("a.tif", Fingerprint(size=20, modified="2", sample_sha256="c" * 64))]),
        key(images=[("b.tif", IMAGE)]),
        key(images=[]),
        key(share=RankShare(1, 64, 192)),
        key(world_size=3),
    }
    assert len(keys) == 8
    assert key() == key()  # a pure function: every rank computes the same


def write_part(staging: Staging, share: RankShare = SHARE, payload: bytes = b"tiff") -> PartRecord:
    with PartWriter(staging, share, 2, key(share=share), probabilities=False) as part:
        Path(part.tiles_out).write_bytes(payload)
        return part.commit(3, [5, 6, 7])


def test_a_committed_part_reads_back(tmp_path: Path) -> None:
    staging = Staging(str(tmp_path / "lc.tif"))
    record = write_part(staging)
    assert staging.read_record(1, 2, key()) == record
    assert (record.windows, record.class_pixels, dict(record.file_bytes)) == (
        3,
        (5, 6, 7),
        {CLASSES: 4},
    )
    assert staging.url == f"{tmp_path / 'lc.tif'}.parts"
    stem = f"part-00001-of-00002.{key()}"
    assert staging.names() == {f"{stem}.tif", f"{stem}.json"}  # no temporary file left


def test_a_part_without_its_record_or_of_another_key_is_not_read(tmp_path: Path) -> None:
    staging = Staging(str(tmp_path / "lc.tif"))
    assert staging.read_record(1, 2, key()) is None  # nothing yet
    write_part(staging)
    assert staging.read_record(1, 2, key(world_size=3)) is None
    assert staging.read_record(0, 2, key()) is None


@pytest.mark.parametrize(
    "damage", ["cut part", "missing part", "garbage record", "renamed record", "unknown file"]
)
def test_a_damaged_part_is_not_trusted(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    staging = Staging(str(tmp_path / "lc.tif"))
    write_part(staging)
    part = Path(staging.path(staging.name(1, 2, key(), CLASSES)))
    record = Path(staging.path(staging.name(1, 2, key(), RECORD)))
    if damage == "cut part":
        part.write_bytes(b"ti")
    elif damage == "missing part":
        part.unlink()
    elif damage == "garbage record":
        record.write_text("{not json")
    elif damage == "renamed record":  # another part's record copied under this name
        other = json.loads(record.read_text())
        record.write_text(json.dumps({**other, "rank": 0}))
    else:  # a record naming a file kind this version does not write
        other = json.loads(record.read_text())
        record.write_text(json.dumps({**other, "file_bytes": {"mask": 4}}))
    assert staging.read_record(1, 2, key()) is None
    assert f"ignoring {record}" in caplog.text


def test_a_share_without_rows_commits_a_record_only(tmp_path: Path) -> None:
    staging = Staging(str(tmp_path / "lc.tif"))
    empty = RankShare(1, 128, 128)
    with PartWriter(staging, empty, 2, key(share=empty), probabilities=True) as part:
        record = part.commit(0, [0, 0, 0])
    assert dict(record.file_bytes) == {}
    assert staging.names() == {staging.name(1, 2, key(share=empty), RECORD)}


def test_a_failed_part_leaves_nothing_and_remove_clears_the_area(tmp_path: Path) -> None:
    staging = Staging(str(tmp_path / "lc.tif"))
    with (
        pytest.raises(RuntimeError),
        PartWriter(staging, SHARE, 2, key(), probabilities=True) as part,
    ):
        Path(part.tiles_out).write_bytes(b"half")
        raise RuntimeError("killed")
    assert staging.names() == set()
    write_part(staging)
    staging.remove()
    assert not Path(staging.root).exists()
    staging.remove()  # twice is fine


def test_a_record_of_another_format_version_is_refused() -> None:
    obj = PartRecord(1, 2, "k", 0, 64, 3, (1, 2), {}).to_json()
    assert PartRecord.from_json(obj).to_json() == obj
    with pytest.raises(ValueError, match="version 1"):
        PartRecord.from_json({**obj, "version": 99})
