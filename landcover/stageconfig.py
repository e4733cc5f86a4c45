"""A stage (`tile`, `predict`, a tiled product's `predict`) as one frozen config, and how it
reaches the ranks and tasks that run it.

`TileStage` and `PredictStage` hold every option of their stage, the inputs RESOLVED (globs
expanded, STAC searched once, by the process that builds them: the command, the Python API or
`cluster launch`) and, for `predict`, the region parsed and the tiled product's tile size
(`PredictConfig.tile_px`). Each option is checked once, where the config is built (the
configs' constructors); nothing downstream parses a command line.

Ranks receive the stage, never the user's argv: `publish_stage` writes it once as canonical
JSON (sorted keys, no spaces) in the stage's staging area beside its output
(`tiling.staged.staging_url`: `<out>.parts/`), named by the SHA-256 of that text
(`tiling.staged.content_key`), published whole through the staged-parts folder
(`tiling.staged.StagedFolder`); a rank reads it with `read_stage`, which refuses a file whose
digest is not the one in its name. The staging area is the one place every rank of every
engine reaches (ranks on other machines share nothing else with the launcher), so it is used
for local ranks too, a remote output included (one rule; the cost is one small upload). Rank 0
removes the staging area when it commits the output, the stage file with it; a launcher that
waits for its job removes what is left (`remove_published`), and a submitted job's file stays
until that job's rank 0 commits (a rerun with the same options publishes the same name).

Storage options never go in the file (nor on a command line): a rank gets them in its
environment (`landcover.options.storage_options_env`), and they are put back into the
config it reads (`read_stage(..., storage_options=)`). Dask tasks receive the stage object
itself (pickled by the engine), as they receive every argument.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from landcover.errors import LandcoverError, OutputError
from landcover.prediction.config import PredictConfig
from landcover.prediction.tilesize import require_tile_size
from tiling.errors import TilingError
from tiling.runtime.urls import is_local, local_path
from tiling.sources.stacquery import StacSource
from tiling.staged import StagedFolder, content_key, staging_url
from tiling.tiler.config import TileConfig

if TYPE_CHECKING:
    from landcover.prediction.region import Region

STAGE_FORMAT = "landcover-stage"
STAGE_VERSION = 1
DIGEST_HEX = 64  # the whole SHA-256 in the name: the name vouches for every byte
_PREFIX = "stage-"
USER_ERRORS = (LandcoverError, TilingError)
_SUFFIX = ".json"


class StageConfigError(LandcoverError):
    """A stage file that is missing, damaged or of another version."""


@dataclass(frozen=True, slots=True)
class TileStage:
    """`landcover tile` as one object: the tiling's config, its images resolved."""

    config: TileConfig
    name = "tile"

    @property
    def out(self) -> str:
        return self.config.out

    @property
    def runs_units(self) -> bool:
        """Its units (the sources) can be tasks of a task engine."""
        return True


@dataclass(frozen=True, slots=True)
class PredictStage:
    """`landcover predict` as one object: the prediction's config (images resolved, region
    parsed, `tile_px` for a tiled product) and what the command writes beside the map: the
    STAC items the images came from (cited by `stac_item` and by a tiled product's items),
    a STAC item for one COG, and the quicklook."""

    config: PredictConfig
    stac_sources: tuple[StacSource, ...] = ()
    stac_item: str | None = None
    quicklook: bool = False
    name = "predict"

    @property
    def out(self) -> str:
        return self.config.out

    @property
    def tiled(self) -> bool:
        """Whether this is a tiled map product (one COG per tile)."""
        return self.config.tile_px is not None

    @property
    def runs_units(self) -> bool:
        """Its units (the tiles) can be tasks of a task engine; one COG runs as ranks."""
        return self.tiled


Stage = TileStage | PredictStage


def check_predict_outputs(config: PredictConfig, stac_item: str | None) -> None:
    """The checks of a prediction's outputs that tie options together, made once where its
    stage is built (the command, the Python API), before its inputs are resolved: a
    directory `--out` needs a tile size, and a tiled product writes no `--stac-item`."""
    require_tile_size(config.out, config.tile_px)
    if config.tile_px is not None and stac_item is not None:
        raise OutputError(
            f"--stac-item {stac_item}: a tiled product writes its own collection.json; "
            "drop --stac-item"
        )


# -- canonical JSON ------------------------------------------------------------------------


def stage_to_json(stage: Stage) -> dict[str, Any]:
    """The stage as JSON values, storage options left out."""
    body: dict[str, Any] = {
        "format": STAGE_FORMAT,
        "version": STAGE_VERSION,
        "stage": stage.name,
        "config": _config_json(stage.config),
    }
    if isinstance(stage, PredictStage):
        body["stac_sources"] = [_stac_json(s) for s in stage.stac_sources]
        body["stac_item"] = stage.stac_item
        body["quicklook"] = stage.quicklook
    return body


def stage_from_json(
    obj: Mapping[str, Any], *, storage_options: Mapping[str, Any] | None = None
) -> Stage:
    """The stage `stage_to_json` gave, with `storage_options` put back; ValueError for one of
    another format or version."""
    if obj.get("format") != STAGE_FORMAT or obj.get("version") != STAGE_VERSION:
        raise ValueError(f"not a {STAGE_FORMAT} file of version {STAGE_VERSION}")
    options = dict(storage_options or {})
    values = dict(obj["config"])
    if obj["stage"] == TileStage.name:
        return TileStage(_config(TileConfig, values, options))
    if obj["stage"] != PredictStage.name:
        raise ValueError(f"unknown stage {obj['stage']!r}")
    if values.get("region") is not None:
        values["region"] = _region_from_json(values["region"])
    return PredictStage(
        _config(PredictConfig, values, options),
        stac_sources=tuple(_stac_from_json(s) for s in obj["stac_sources"]),
        stac_item=obj["stac_item"],
        quicklook=bool(obj["quicklook"]),
    )


def canonical_text(stage: Stage) -> str:
    """The one text of a stage: JSON with sorted keys and no spaces (`content_key`'s)."""
    return json.dumps(stage_to_json(stage), sort_keys=True, separators=(",", ":"))


def stage_url(stage: Stage) -> str:
    """Where `publish_stage` puts `stage`: its staging area, named by its digest."""
    digest = content_key(stage_to_json(stage), DIGEST_HEX)
    return f"{staging_url(stage.out)}/{_PREFIX}{digest}{_SUFFIX}"


def publish_stage(stage: Stage) -> str:
    """Publish `stage` once, whole, in its staging area; its URL (`stage_url`)."""
    url = stage_url(stage)
    folder, name = _folder_of(url, stage.config.storage_options)
    folder.put_bytes(name, canonical_text(stage).encode())
    return url


def read_stage(url: str, *, storage_options: Mapping[str, Any] | None = None) -> Stage:
    """The stage published at `url`, its digest checked against its name; one line
    (`StageConfigError`) when it is missing, damaged or not a stage file."""
    folder, name = _folder_of(url, storage_options or {})
    if not (name.startswith(_PREFIX) and name.endswith(_SUFFIX)):
        raise StageConfigError(f"{url}: not a stage file (stage-<sha256>.json)")
    data = folder.read_bytes(name)
    if data is None:
        raise StageConfigError(
            f"{url}: no stage file there; its launcher publishes it before starting the ranks, "
            "and rank 0 removes it with the staging area once the output is committed"
        )
    digest = name[len(_PREFIX) : -len(_SUFFIX)]
    try:
        obj = json.loads(data)
        if content_key(obj, DIGEST_HEX) != digest:
            raise ValueError("its content does not match the digest in its name")
        # a config that refuses a value it holds raises its own one line (not caught here)
        stage = stage_from_json(obj, storage_options=storage_options)
    except USER_ERRORS:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StageConfigError(
            f"{url}: unreadable stage file ({exc}); launch the job again"
        ) from None
    if not _same_place(url, stage_url(stage)):
        # a copy elsewhere would run the job outside the staging area its launcher watches
        raise StageConfigError(
            f"{url}: a stage file for {stage.out} is read only from its staging area "
            f"{staging_url(stage.out)}/; launch the job again"
        )
    return stage


def remove_published(url: str, *, storage_options: Mapping[str, Any] | None = None) -> None:
    """Remove a published stage file if it is still there, and its staging area when that
    holds nothing else (a launcher that waited for its job, whatever the outcome)."""
    folder, name = _folder_of(url, storage_options or {})
    folder.delete(name)
    if not folder.names():
        folder.remove()


def _same_place(url: str, expected: str) -> bool:
    """Whether `url` names the file at `expected` (local paths compared absolute)."""
    if is_local(url) and is_local(expected):
        return os.path.abspath(local_path(url)) == os.path.abspath(local_path(expected))
    return url.rstrip("/") == expected.rstrip("/")


def _folder_of(url: str, storage_options: Mapping[str, Any]) -> tuple[StagedFolder, str]:
    parent, _, name = url.rpartition("/")
    return StagedFolder(parent, storage_options), name


def _config_json(config: TileConfig | PredictConfig) -> dict[str, Any]:
    """A config's fields as JSON values: tuples as lists, the region as its geometry's WKB
    (exact, unlike WKT's decimals) and its CRS's WKT; not its storage options."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        if f.name == "storage_options":
            continue
        value = getattr(config, f.name)
        if f.name == "region" and value is not None:
            value = _region_json(value)
        elif isinstance(value, tuple):
            value = list(value)
        values[f.name] = value
    return values


def _config(kind: type[Any], values: dict[str, Any], storage_options: dict[str, Any]) -> Any:
    """`kind` from its JSON values (lists back to tuples), its constructor's checks applied."""
    fixed = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return kind(**fixed, storage_options=storage_options)


def _region_json(region: Region) -> dict[str, str]:
    return {"wkb": region.geometry.wkb_hex, "crs": region.crs.to_wkt()}


def _region_from_json(obj: Mapping[str, str]) -> Region:
    import shapely
    from rasterio.crs import CRS

    from landcover.prediction.region import Region

    return Region(shapely.from_wkb(bytes.fromhex(obj["wkb"])), CRS.from_wkt(obj["crs"]))


def _stac_json(source: StacSource) -> dict[str, Any]:
    values = dataclasses.asdict(source)
    for key in ("start", "end"):
        if values[key] is not None:
            values[key] = values[key].isoformat()
    return values


def _stac_from_json(obj: Mapping[str, Any]) -> StacSource:
    values = dict(obj)
    for key in ("start", "end"):
        if values[key] is not None:
            values[key] = datetime.fromisoformat(values[key])
    return StacSource(**values)


__all__ = [
    "PredictStage",
    "Stage",
    "StageConfigError",
    "TileStage",
    "publish_stage",
    "read_stage",
    "remove_published",
    "stage_url",
]
