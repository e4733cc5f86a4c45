"""The Python API: the pipeline's three steps as three calls, for notebooks and scripts.

```python
import landcover

landcover.tile(["naip/*.tif"], "chips.zarr", labels=["lc/*.tif"])
run = landcover.train("chips.zarr", "runs/r1", epochs=5)
landcover.predict(run.run_dir / "model.pt", "naip/*.tif", "map.tif", bbox=(-76.6, 39, -76.5, 39.1))
```

Each call takes the options of its command (`landcover tile`, `landcover train`,
`landcover predict`) as keyword arguments named like the config fields (`chip_size=`,
`batch_size=`, `block_px=`; typed by `landcover.apioptions`, their defaults the config's),
builds the same frozen config the CLI builds (for `tile` and `predict`, the same stage,
`landcover.stageconfig`, its inputs resolved once) and runs it the same way
(`landcover.stagerun.run_stage`), so a script and a command line give the same store, run and
map. Bad input raises the package's error
(`tiling.errors.TilingError`, `landcover.errors.LandcoverError`) with the one-line message the
CLI would print.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from landcover.apioptions import PredictOptions, TileOptions, TrainOptions
from landcover.errors import LandcoverError

if TYPE_CHECKING:
    from shapely.geometry.base import BaseGeometry

    from landcover.prediction.runner import PredictResult
    from landcover.prediction.tiled import TiledResult
    from landcover.stagerun import Executor
    from landcover.training.trainer import TrainResult
    from tiling.tiler.tile import TileResult

PathLike = str | os.PathLike[str]
Sources = PathLike | Iterable[PathLike]
Bbox = tuple[float, float, float, float]


def tile(
    images: Sources,
    out: PathLike,
    *,
    labels: Sources = (),
    cluster: Any = None,
    **options: Unpack[TileOptions],
) -> TileResult:
    """Cut `images` (paths, globs or URLs) and their `labels` into a chip store at `out`.

    `options` are `tiling.tiler.config.TileConfig` fields: `chip_size=256`, `stride`, `shard_size`,
    `min_valid`, `class_map`, `val_fraction`, `workers`, `storage_options`, `overwrite`, ...
    Rerunning the same call resumes an interrupted store, as `landcover tile` does.
    `cluster`: a cluster.json path (engine "dask") or a `distributed.Client`; each source is
    then cut by a task on that Dask cluster, and the store is the one this process writes.
    """
    from landcover.stageconfig import TileStage
    from landcover.stagerun import run_stage
    from tiling.sources.inputs import resolve_inputs
    from tiling.tiler.config import TileConfig

    config = _config(
        TileConfig, images=_strings(images), out=os.fspath(out), labels=_strings(labels), **options
    )
    executor = _executor(cluster, "tile")
    inputs = resolve_inputs(config.images, storage_options=config.storage_options)
    stage = TileStage(dataclasses.replace(config, images=inputs.paths))
    result: TileResult = run_stage(stage, executor).result
    return result


def train(
    store: PathLike, out: PathLike, *, cluster: Any = None, **options: Unpack[TrainOptions]
) -> TrainResult:
    """Train a model on chip store `store` into run directory `out` (in this process).

    `options` are `landcover.training.config.TrainConfig` fields: `model="small_unet"`,
    `epochs=10`, `batch_size=16`, `lr`, `compression`, `block_momentum`, `resume`,
    `overwrite`, ... The run directory holds `model.pt`, `metrics.jsonl` and `run.json`, as
    after `landcover train`; for several workers use `landcover train --nproc N` or
    `landcover cluster launch`, or `cluster`: a cluster.json path or a `distributed.Client`
    (one DDP rank per Dask worker), the result then read back from the run dir.
    """
    from landcover.training.config import TrainConfig
    from landcover.training.worker import train as run_training

    config = _config(TrainConfig, store_url=os.fspath(store), out_dir=os.fspath(out), **options)
    if cluster is not None:
        from landcover.oncluster import train_on_cluster

        return train_on_cluster(config, cluster)
    return run_training(config)


def predict(
    model: PathLike,
    images: Sources,
    out: PathLike,
    *,
    region: PathLike | Mapping[str, Any] | BaseGeometry | None = None,
    bbox: Bbox | None = None,
    region_crs: str | None = None,
    cluster: Any = None,
    tile_px: int | None = None,
    **options: Unpack[PredictOptions],
) -> PredictResult | TiledResult:
    """Predict a land-cover COG at `out` from the model file `model` and `images`; with
    `tile_px`, a tiled map product in the directory `out` (one COG per tile of that edge, a
    STAC collection and a VRT mosaic; `landcover.prediction.tiled`).

    The region is a GeoJSON or WKT file, a parsed GeoJSON mapping, a shapely geometry, or a
    `bbox` (W, S, E, N); coordinates in `region_crs` (default EPSG:4326). Without either, the
    union of the images. `options` are `landcover.prediction.config.PredictConfig` fields:
    `resolution`, `overlap_px`, `batch_size`, `device`, `probabilities`, `block_px`,
    `overwrite`, `storage_options`, `max_pixels`, ...
    `cluster`: a cluster.json path (engine "dask") or a `distributed.Client`; each worker
    then predicts its share of the block rows as one rank, and the COG is the same; a tiled
    product's tiles are tasks of their own.
    """
    from landcover.prediction.config import PredictConfig
    from landcover.stageconfig import PredictStage, check_predict_outputs
    from landcover.stagerun import run_stage
    from tiling.sources.inputs import resolve_inputs

    _check_types({"tile_px": tile_px}, {"tile_px": "int | None"}, "predict")
    config = _config(
        PredictConfig,
        model=os.fspath(model),
        images=_strings(images),
        out=_out_text(out, tile_px),
        region=_region(region, bbox, region_crs),
        tile_px=tile_px,
        **options,
    )
    check_predict_outputs(config, stac_item=None)  # the CLI's checks, before the inputs
    executor = _executor(cluster, "predict")
    inputs = resolve_inputs(config.images, storage_options=config.storage_options)
    stage = PredictStage(dataclasses.replace(config, images=inputs.paths), inputs.stac_items)
    result: PredictResult | TiledResult = run_stage(stage, executor).result
    return result


def _executor(cluster: Any, stage: str) -> Executor:
    """How a call runs its stage: in this process, or as tasks on `cluster`
    (`landcover.oncluster`)."""
    if cluster is None:
        from landcover.stagerun import InProcess

        return InProcess()
    from landcover.oncluster import tasks_on

    return tasks_on(cluster, stage)


def _out_text(out: PathLike, tile_px: object) -> str:
    """`out` as `--out` would be written: a `Path` cannot end in a slash, so one without a
    suffix, given with `tile_px`, names a directory (as `--out DIR/` does); a string is
    taken as written, and checked as the CLI checks it (`tiled_output`)."""
    text = os.fspath(out)
    if tile_px is None or isinstance(out, str) or text.endswith("/") or Path(text).suffix:
        return text
    return text + "/"


def _strings(sources: Sources) -> tuple[str, ...]:
    """One path, glob or URL, or several, as the tuple of strings the configs take."""
    if isinstance(sources, str | os.PathLike):
        return (os.fspath(sources),)
    return tuple(os.fspath(s) for s in sources)


def _config(kind: type[Any], **values: Any) -> Any:
    """`kind(**values)`, with an unknown option, or a value of the wrong type, named as a
    one-line error."""
    names = {f.name for f in dataclasses.fields(kind) if f.init}
    unknown = sorted(set(values) - names)
    if unknown:
        raise LandcoverError(
            f"unknown option {unknown[0]!r} for {kind.__name__}; use one of: "
            + ", ".join(sorted(names))
        )
    hints = {f.name: f.type for f in dataclasses.fields(kind) if isinstance(f.type, str)}
    _check_types(values, hints, kind.__name__)
    return kind(**values)


def _check_types(values: Mapping[str, Any], hints: Mapping[str, str], where: str) -> None:
    """One line for an option whose value is not of its annotated type (`tile_px="256"`),
    before it fails deep inside as a TypeError. Annotations this cannot read are not
    checked: the config's own checks still apply."""
    for name, value in values.items():
        hint = hints.get(name)
        if hint is None or _accepts(value, hint) is not False:
            continue
        raise LandcoverError(
            f"{name}={value!r}: {where} takes {name} as {hint}, not a {type(value).__name__}"
        )


_SCALARS: dict[str, tuple[type, ...]] = {
    "int": (numbers.Integral,),  # numpy's integers too
    "float": (numbers.Real,),
    "str": (str,),
    "bool": (bool,),
    "None": (type(None),),
}


def _accepts(value: Any, hint: str) -> bool | None:
    """Whether `value` fits the annotation `hint` (an int is no bool, a bool no int); None
    when the annotation is more than simple types joined by `|` (not judged)."""
    answers = []
    for part in (p.strip() for p in hint.split("|")):
        kinds = _SCALARS.get(part)
        if kinds is None:
            return None
        fits = isinstance(value, kinds) and (part == "bool" or not isinstance(value, bool))
        answers.append(fits)
    return any(answers)


def _region(
    region: PathLike | Mapping[str, Any] | BaseGeometry | None,
    bbox: Bbox | None,
    crs: str | None,
) -> Any:
    """The `Region` the CLI's --region/--bbox would give, from Python values."""
    from shapely.geometry import mapping

    from landcover.prediction.region import (
        DEFAULT_REGION_CRS,
        parse_bbox,
        parse_region,
        region_from_geojson,
    )

    if region is not None and bbox is not None:
        raise LandcoverError("give either region= or bbox=, not both")
    if bbox is not None:
        return parse_bbox(",".join(repr(float(v)) for v in bbox), crs=crs or DEFAULT_REGION_CRS)
    if region is None:
        return None
    if isinstance(region, str | os.PathLike):
        return parse_region(region, crs=crs)
    geojson = region if isinstance(region, Mapping) else mapping(region)
    return region_from_geojson(geojson, crs=crs)
