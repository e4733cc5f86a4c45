"""The files a prediction writes: checked before the run, written under temporary names,
turned into COGs and put into place only when everything succeeded.

Outputs are local paths (or file:// URLs) or fsspec URLs such as az://container/lc.tif. A
local output's temporary files sit beside it and are renamed into place; a remote output's
sit in a local temporary directory (GDAL writes files) and are uploaded whole at the end (a
blob is committed by its last request, so a reader never sees half of one).

`check_outputs` runs before the model is loaded: an output that cannot be written fails in a
second, not after an hour of inference. `TempOutputs` is a context manager: its temporary
files go on every way out of the `with` block (an error, Ctrl-C, or SIGTERM once the CLI turns
it into an exception), so a rerun never finds a half-written file, and only `commit` puts the
finished COGs at the output names.
"""

from __future__ import annotations

import glob
import json
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import rasterio
import rasterio.shutil
from rasterio.enums import ColorInterp

from landcover.classes import NODATA_CODE, colormap
from landcover.errors import LandcoverError, OutputError, PredictionError
from landcover.outputs import (
    GEOTIFF_SUFFIXES,
    check_output_file,
    check_output_format,
    local_output,
    publish,
    refuse_existing,
    require_distinct,
)
from landcover.prediction.outgrid import (
    TAG_CLASS_MAP,
    TAG_CLASS_NAMES,
    TAG_MODEL,
    TAG_SOURCES,
    OutputGrid,
    sources_tag,
)
from landcover.writefailures import raster_write_refusal
from tiling.runtime.urls import filesystem, is_local, storage_errors

if TYPE_CHECKING:  # modelfile imports torch, which writing files never needs
    from landcover.models.modelfile import ModelMeta

# Probabilities are stored as round(p * 254); 255 marks pixels outside the region.
PROBABILITY_SCALE = 254
PROBABILITY_NODATA = 255
COG_BLOCK_PX = 512


@dataclass(frozen=True, slots=True)
class OutputPaths:
    """The class map and, optionally, the probabilities raster (local paths or URLs), and
    whether they may replace existing files (--overwrite)."""

    out: str
    probabilities: str | None = None
    overwrite: bool = False


def check_outputs(
    out: str,
    probabilities: str | None,
    *,
    overwrite: bool,
    storage_options: Mapping[str, Any] | None = None,
) -> OutputPaths:
    """Fail now if an output cannot be written: the same file as the other output, a
    directory, existing without `overwrite`, where no file can be created (missing
    directories are fine: they are created when writing starts), or on storage that does
    not answer."""
    out = local_output(out)
    probabilities = local_output(probabilities) if probabilities else None
    paths = [("--out", out)] + ([("--probabilities", probabilities)] if probabilities else [])
    require_distinct(paths)
    for option, path in paths:
        example = "lc.tif" if option == "--out" else "probabilities.tif"
        check_output_format(path, option=option, expected=GEOTIFF_SUFFIXES, example=example)
        if not is_local(path):
            _check_remote(option, path, storage_options, overwrite=overwrite)
            continue
        check_output_file(path, option=option, overwrite=overwrite, example="lc.tif")
    return OutputPaths(out, probabilities, overwrite)


def _check_remote(
    option: str, url: str, storage_options: Mapping[str, Any] | None, *, overwrite: bool
) -> None:
    fs, path = filesystem(url, storage_options)  # an unreachable account fails here
    with storage_errors(url):
        if fs.isdir(path):
            raise PredictionError(
                f"{option} {url} is a directory; give a file name like {url.rstrip('/')}/lc.tif"
            )
        refuse_existing([url], overwrite=overwrite, exists=lambda _: bool(fs.exists(path)))


class TempOutputs:
    """Temporary local names for each output: the tiled GeoTIFFs written block by block, then
    their COGs. Use as a context manager; leaving it removes whatever was not committed."""

    def __init__(
        self, outputs: OutputPaths, storage_options: Mapping[str, Any] | None = None
    ) -> None:
        token = uuid.uuid4().hex[:8]
        out, prob = outputs.out, outputs.probabilities
        self.out, self.prob = out, prob
        self.overwrite = outputs.overwrite
        self.storage_options = dict(storage_options or {})
        remote = [p for p in (out, prob) if p is not None and not is_local(p)]
        # GDAL writes local files: a remote output's are made here and uploaded at the end.
        self.scratch = tempfile.mkdtemp(prefix="landcover-predict-") if remote else None
        self.tiles_out = self._temp_name(out, token, "tiles")
        self.cog_out = self._temp_name(out, token, "cog")
        self.tiles_prob = None if prob is None else self._temp_name(prob, token, "tiles")
        self.cog_prob = None if prob is None else self._temp_name(prob, token, "cog")

    def __enter__(self) -> TempOutputs:
        for path in (self.out, self.prob):
            if path is not None and is_local(path):
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                _remove_killed_runs_files(Path(path))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove_all()
        # A full disk or a file size limit (ulimit -f) under GDAL's writes: one line naming
        # the output, not GDAL's words about a temp file.
        refusal = None if exc is None else raster_write_refusal(self.out, exc)
        if refusal is not None:
            raise OutputError(refusal) from exc

    def commit(self) -> None:
        """Put the COGs in place: rename (local; without --overwrite, never over a file that
        appeared since the check) or upload (remote)."""
        # The probabilities first: the class map appearing is the sign that the run finished.
        if self.prob is not None and self.cog_prob is not None:
            self._put(self.cog_prob, self.prob)
        try:
            self._put(self.cog_out, self.out)
        except BaseException:
            if self.prob is not None and not self.overwrite and is_local(self.prob):
                Path(self.prob).unlink(missing_ok=True)  # placed just now, not the user's
            raise

    def remove_all(self) -> None:
        """Delete every temporary file (and GDAL's .aux.xml side files) that exists."""
        for path in (self.tiles_out, self.cog_out, self.tiles_prob, self.cog_prob):
            if path is not None:
                Path(path).unlink(missing_ok=True)
                Path(path + ".aux.xml").unlink(missing_ok=True)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def _temp_name(self, path: str, token: str, kind: str) -> str:
        if is_local(path):
            target = Path(path)
            return str(target.parent / f".{target.name}.{token}.{kind}.part.tif")
        assert self.scratch is not None  # made in __init__ for every remote output
        name = path.rstrip("/").rsplit("/", 1)[-1]
        return str(Path(self.scratch) / f"{name}.{token}.{kind}.part.tif")

    def _put(self, local: str, target: str) -> None:
        if is_local(target):
            publish(local, target, overwrite=self.overwrite)
            return
        fs, path = filesystem(target, self.storage_options)
        with storage_errors(target):
            fs.put_file(local, path)


def _remove_killed_runs_files(target: Path) -> None:
    """Remove the temporary files a killed run left beside `target`
    (`.<name>.<token>.<kind>.part.tif`, and GDAL's .aux.xml of them). Only the holder of the
    output's lock writes them (`landcover.outputlock`: rank 0 of a run, or its one process),
    so none of them belongs to a live run."""
    if not target.parent.is_dir():
        return
    for leftover in target.parent.glob(f".{glob.escape(target.name)}.*.part.tif*"):
        leftover.unlink(missing_ok=True)


def class_profile(grid: OutputGrid) -> dict[str, Any]:
    """Creation options of the tiled class GeoTIFF written block by block."""
    return {
        "driver": "GTiff",
        "width": grid.width,
        "height": grid.height,
        "count": 1,
        "dtype": "uint8",
        "crs": grid.crs,
        "transform": grid.transform,
        "nodata": NODATA_CODE,
        "tiled": True,
        "blockxsize": COG_BLOCK_PX,
        "blockysize": COG_BLOCK_PX,
        "compress": "deflate",
        "zlevel": 1,  # an intermediate file: speed over size
        "bigtiff": "if_safer",
        "sparse_ok": True,  # blocks outside the region are never written: they read as nodata
    }


def probability_profile(grid: OutputGrid, meta: ModelMeta) -> dict[str, Any]:
    """Creation options of the tiled probabilities GeoTIFF (one band per class but nodata)."""
    profile = class_profile(grid)
    profile.update(count=meta.num_classes - 1, nodata=PROBABILITY_NODATA, interleave="pixel")
    return profile


def describe_class_raster(dst: Any, meta: ModelMeta, *, sources: Sequence[str] = ()) -> None:
    """Colour table, band description and class tags of the class raster, and the images it
    is predicted from (`sources`; local paths made absolute) for viewers to show beneath it."""
    dst.write_colormap(1, colormap(meta.class_map))
    dst.set_band_description(1, "land cover class")
    dst.update_tags(**_class_tags(meta))
    if sources:
        dst.update_tags(**{TAG_SOURCES: sources_tag(sources)})


def describe_probability_raster(dst: Any, meta: ModelMeta) -> None:
    """Band names (the class names), no colour interpretation, the 1/254 scale and the class
    tags of the probabilities raster.

    GDAL calls 3 or 4 uint8 bands red, green, blue (and alpha) unless told otherwise; a viewer
    would then show the probabilities as a colour image with the 4th class as transparency.
    In a GeoTIFF the first band of such a raster reads as gray, the others as undefined.
    """
    bands = meta.num_classes - 1
    dst.colorinterp = [ColorInterp.undefined] * bands
    for code, name in enumerate(meta.class_map.class_names[1:], start=1):
        dst.set_band_description(code, name)
    dst.scales = tuple(1 / PROBABILITY_SCALE for _ in range(meta.num_classes - 1))
    dst.offsets = tuple(0.0 for _ in range(meta.num_classes - 1))
    dst.update_tags(**_class_tags(meta))


def _class_tags(meta: ModelMeta) -> dict[str, str]:
    return {
        TAG_CLASS_MAP: json.dumps(meta.class_map.to_json(), separators=(",", ":")),
        TAG_CLASS_NAMES: json.dumps(meta.class_map.class_names),
        TAG_MODEL: meta.architecture,
    }


def write_cogs(temps: TempOutputs, classes: str, probabilities: str | None) -> None:
    """The outputs' COGs at `temps`' COG names from the tiled (or VRT) `classes` and
    `probabilities`: class overviews by mode (a class, never an average of codes),
    probability overviews by average."""
    to_cog(classes, temps.cog_out, resampling="MODE")
    if probabilities is not None and temps.cog_prob is not None:
        to_cog(probabilities, temps.cog_prob, resampling="AVERAGE")


def to_cog(src: str, dst: str, *, resampling: str) -> None:
    """Copy a tiled GeoTIFF to a Cloud-Optimized GeoTIFF with overviews by `resampling`."""
    try:
        rasterio.shutil.copy(
            src,
            dst,
            driver="COG",
            COMPRESS="DEFLATE",
            BLOCKSIZE=COG_BLOCK_PX,
            OVERVIEW_RESAMPLING=resampling,
            BIGTIFF="IF_SAFER",
            NUM_THREADS="ALL_CPUS",
            SPARSE_OK="TRUE",
        )
    except rasterio.errors.RasterioIOError as exc:
        if raster_write_refusal(dst, exc) is not None:
            raise  # the file system's refusal: the caller names its output
        raise LandcoverError(f"{dst}: could not write the COG ({exc})".splitlines()[0]) from None
