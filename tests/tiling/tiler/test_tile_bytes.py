"""The bytes `tile` writes, pinned: every object of three small stores against pinned digests,
so that no faster path (reading, masks, statistics, encoding, shard assembly) can change a
byte of a store.

Covered: labels read on the image grid from two tiles (first wins, a nodata stripe), labels
warped from 30 m Albers, an image with a nodata corner, overlapping chips (stride < chip
size), the --min-valid filter, the split, and the real NAIP files (alpha-tagged NIR, a
nodata tag, strips). The group metadata and the source records are compared with their file paths
made relative and the files' modification times and the digest of the parameters (of full
paths) left out: they change with every checkout.
Format version 3 (source records out of the group attribute) changed only `zarr.json` and
added the `sources` objects; every shard object kept its digest.

Compressing every chunk with the level's parameters for a large input
(`tiling.chipstore.shards.chunk_compression_parameters`) changed the chunks' bytes, not the
arrays they decode to (checked against stores of the former encoder, array for array).

An upgrade of zstd (zstandard) or of GDAL's warper may change these bytes on purpose: then
check the stores by other means (test_tile.py, test_store.py) and record the new digests
(`python -m tests.tiling.tiler.test_tile_bytes` prints them).
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import zarr

from tests.conftest import REAL_NAIP_DIR
from tests.tiling.rasters import Scenes, make_scenes
from tiling.tiler.tile import TileConfig, tile

# modification times, and the digest of the parameters (they hold the inputs' full paths)
UNPORTABLE = ("modified", "params_sha256")
CASES = ("aligned_labels", "warped_labels_overlapping_chips", "real_naip_images_only")

# case -> object path inside the store -> first 16 hex digits of its SHA-256
PINNED: dict[str, dict[str, str]] = {
    "aligned_labels": {
        "images/c/0/0/0/0": "c47bc79986f535ec",
        "images/c/1/0/0/0": "cc1009dbdfa4e5b8",
        "images/c/2/0/0/0": "1c06abfd3c92183e",
        "images/c/3/0/0/0": "b9ed61a14359c343",
        "images/c/4/0/0/0": "612d1e7af0819765",
        "images/zarr.json": "e8255d0cad350bd4",
        "index/c/0/0": "7dbfc83ad926e5aa",
        "index/c/1/0": "1bca22b73eb54804",
        "index/c/2/0": "2125a67905336fc2",
        "index/c/3/0": "26d5ed4770c03fcb",
        "index/c/4/0": "1c62245ac336d4f7",
        "index/zarr.json": "e7184f696e7f9411",
        "labels/c/0/0/0": "02ad64b28ec3d35b",
        "labels/c/1/0/0": "0206491871db90ea",
        "labels/c/2/0/0": "03edb211deb0fce7",
        "labels/c/3/0/0": "a3a886afe1165a63",
        "labels/c/4/0/0": "23f2dfb5a1305a77",
        "labels/zarr.json": "a567df067933ae9f",
        "sources/c/0": "e82e0ec3f365f575",
        "sources/c/1": "e9bfd41bc48de47b",
        "sources/zarr.json": "e2f36242cf318e3f",
        "zarr.json": "99d0800ea36e05a2",
    },
    "warped_labels_overlapping_chips": {
        "images/c/0/0/0/0": "9300af75a9bad6e6",
        "images/c/1/0/0/0": "9a4f3b0ae331ef71",
        "images/c/2/0/0/0": "2892d7ee5c7b04a3",
        "images/c/3/0/0/0": "0a9605e6c5675a25",
        "images/c/4/0/0/0": "e3b48b50c43ab2ae",
        "images/c/5/0/0/0": "20b3fafc7864026f",
        "images/c/6/0/0/0": "1b29b2d6b82ad513",
        "images/zarr.json": "7b43cfcd3b96053e",
        "index/c/0/0": "889e490c05c0932d",
        "index/c/1/0": "8a5295babf9412fd",
        "index/c/2/0": "20e7969f6f2aedc2",
        "index/c/3/0": "0095431b7a0dad80",
        "index/c/4/0": "7465be27ee10d4fc",
        "index/c/5/0": "f5a3dff8e698c85c",
        "index/c/6/0": "70be4c5a14192347",
        "index/zarr.json": "ac9b5ec24c9a1fbd",
        "labels/c/0/0/0": "63cc81a3dc1ffa37",
        "labels/c/1/0/0": "091d8feec25637f1",
        "labels/c/2/0/0": "56c555679df4dfb0",
        "labels/c/3/0/0": "59752dd214765083",
        "labels/c/4/0/0": "f1e31b1ccaf64376",
        "labels/c/5/0/0": "9d35c7e14188c040",
        "labels/c/6/0/0": "64ffd4bec9edcaad",
        "labels/zarr.json": "8314e1f1375ba2c2",
        "sources/c/0": "de1d6f2e6af1c7e8",
        "sources/c/1": "870a87a73b25dc01",
        "sources/zarr.json": "d66c8cdb95cf21cb",
        "zarr.json": "714608581c6a0f1a",
    },
    "real_naip_images_only": {
        "images/c/0/0/0/0": "e0b175c14bd8a278",
        "images/c/1/0/0/0": "6d62bd56adbf8890",
        "images/c/2/0/0/0": "dfa35579c5bb7863",
        "images/c/3/0/0/0": "1f20e3113b59c7a2",
        "images/c/4/0/0/0": "f3dd8665d90a65fb",
        "images/c/5/0/0/0": "86a3b82728e5c8ed",
        "images/zarr.json": "b16b29d5c6d92c69",
        "index/c/0/0": "222d958e472947ca",
        "index/c/1/0": "f5e406bf1cd3424c",
        "index/c/2/0": "a53622833906993e",
        "index/c/3/0": "767c72d465b8752e",
        "index/c/4/0": "8c977f23ad463ae5",
        "index/c/5/0": "4342916f1861dc50",
        "index/zarr.json": "2089a5f0427041d9",
        "sources/c/0": "15b79df095244693",
        "sources/c/1": "542f6027a8cd9c8a",
        "sources/c/2": "9ca55751d65d0dd1",
        "sources/c/3": "1610a017b537cbb7",
        "sources/c/4": "87f85067457bdfd4",
        "sources/c/5": "25d762644d0960c8",
        "sources/zarr.json": "eb1eccc04c2e0cb8",
        "zarr.json": "1ddf4e753cc2aa52",
    },
}


def case_configs(scenes: Scenes, out_dir: Path) -> dict[str, TileConfig]:
    """The stores whose bytes are pinned, by case name (CASES)."""
    images = tuple(str(p) for p in scenes.images)
    common: dict[str, Any] = {"chip_size": 64, "shard_size": 16, "workers": 2}
    return {
        "aligned_labels": TileConfig(
            images=images,
            labels=tuple(str(p) for p in scenes.chesapeake),
            out=str(out_dir / "aligned.zarr"),
            min_valid=0.5,
            val_fraction=0.25,
            split_block_chips=2,
            **common,
        ),
        "warped_labels_overlapping_chips": TileConfig(
            images=images,
            labels=(str(scenes.nlcd),),
            class_map="nlcd",
            out=str(out_dir / "warped.zarr"),
            stride=48,
            min_valid=0.0,
            val_fraction=0.2,
            **common,
        ),
        "real_naip_images_only": TileConfig(
            images=tuple(str(p) for p in sorted(REAL_NAIP_DIR.glob("*.tif"))),
            out=str(out_dir / "naip.zarr"),
            min_valid=0.9,
            **common,
        ),
    }


def store_digests(store: Path, roots: dict[str, str]) -> dict[str, str]:
    """Digest of every object under `store`; metadata and source records (JSON that names the
    input files, digested decoded) made independent of where files are."""
    records = zarr.open_array(store / "sources", mode="r")
    digests = {}
    for path in sorted(p for p in store.rglob("*") if p.is_file()):
        key = path.relative_to(store).as_posix()
        data = path.read_bytes()
        if path.name == "zarr.json":
            data = _portable_metadata(data, roots)
        elif key.startswith("sources/c/"):
            data = _portable_metadata(str(records[int(path.name)]).encode(), roots)
        digests[key] = hashlib.sha256(data).hexdigest()[:16]
    return digests


def _portable_metadata(data: bytes, roots: dict[str, str]) -> bytes:
    def portable(value: Any) -> Any:
        if isinstance(value, dict):
            return {portable(k): portable(v) for k, v in value.items() if k not in UNPORTABLE}
        if isinstance(value, list):
            return [portable(v) for v in value]
        if isinstance(value, str):
            for root, name in roots.items():
                value = value.replace(root, name)
        return value

    return json.dumps(portable(json.loads(data)), sort_keys=True).encode()


def tiled_digests(scenes: Scenes, out_dir: Path, case: str) -> dict[str, str]:
    """Tile one case and digest its store."""
    config = case_configs(scenes, out_dir)[case]
    tile(config)
    return store_digests(
        Path(config.out), {str(scenes.root): "<scenes>", str(REAL_NAIP_DIR): "<naip>"}
    )


@pytest.mark.parametrize("case", CASES)
def test_store_bytes_equal_the_pinned_digests(scenes: Scenes, tmp_path: Path, case: str) -> None:
    digests, pinned = tiled_digests(scenes, tmp_path, case), PINNED[case]
    changed = sorted(k for k in digests.keys() | pinned.keys() if digests.get(k) != pinned.get(k))
    assert not changed, f"{case}: objects differ from the pinned store: {changed}"


if __name__ == "__main__":  # print the digests of the current code, to pin them
    with tempfile.TemporaryDirectory() as tmp:
        scenes = make_scenes(Path(tmp) / "scenes")
        found = {case: tiled_digests(scenes, Path(tmp) / case, case) for case in CASES}
    json.dump(found, sys.stdout, indent=4, sort_keys=True)
