"""The sample file: the points `landcover sample` writes (GeoPackage or CSV) with an empty
`reference` column that a person fills (in QGIS, a spreadsheet), and reading it back with
those labels for `landcover evaluate --reference`.

Columns, one row per point: `id`, `x`, `y` (the map's CRS), `lon`, `lat` (WGS 84),
`map_code`, `map_class`, `stratum_pixels` (mapped pixels of its class), `stratum_sample`
(points in its class), `stratum_weight` (its class's share of the map), `inclusion_probability`
(`stratum_sample / stratum_pixels`) and `reference`: a class code or a class name of the
map's table. A GeoPackage holds the points as geometry in the map's CRS; a CSV has no CRS of
its own: its `x`, `y` are taken in the CRS of the map given to `evaluate`, and its `lon`,
`lat` (WGS 84) when it has no `x`, `y`.
"""

from __future__ import annotations

import csv
import io
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyproj
import rasterio
from pyproj import Transformer

from landcover.errors import EvaluationError, OutputError, reason
from landcover.evaluation.sampling import SamplePoints, values_at
from landcover.outputs import write_atomic, write_text_atomic
from tiling.sources.classes import NODATA_CODE, ClassMap

__all__ = [
    "MAP_CODE_COLUMN",
    "REFERENCE_COLUMN",
    "SAMPLE_COLUMNS",
    "SAMPLE_SUFFIXES",
    "ReferenceSample",
    "parse_references",
    "read_reference_sample",
    "references_from_raster",
    "write_sample",
]

REFERENCE_COLUMN = "reference"
MAP_CODE_COLUMN = "map_code"
SAMPLE_COLUMNS = (
    *("id", "x", "y", "lon", "lat", MAP_CODE_COLUMN, "map_class", "stratum_pixels"),
    *("stratum_sample", "stratum_weight", "inclusion_probability", REFERENCE_COLUMN),
)
SAMPLE_SUFFIXES = (".gpkg", ".csv")
LAYER = "sample"
GPKG_DATE = "1970-01-01T00:00:00.000Z"  # the timestamps GDAL writes into a GeoPackage


def check_sample_suffix(path: str | os.PathLike[str], *, option: str) -> str:
    """The sample format of `path` by its suffix ('.gpkg' or '.csv'), else refused."""
    suffix = Path(path).suffix.lower()
    if suffix not in SAMPLE_SUFFIXES:
        raise EvaluationError(
            f"{option} {path}: a sample is a GeoPackage (.gpkg) or a CSV (.csv) file; name it so"
        )
    return suffix


def _columns(points: SamplePoints) -> dict[str, npt.NDArray[np.generic]]:
    to_wgs84 = Transformer.from_crs(
        pyproj.CRS.from_wkt(points.crs_wkt), "EPSG:4326", always_xy=True
    )
    lon, lat = to_wgs84.transform(points.x, points.y)
    code = points.map_code
    names = np.array(points.class_map.class_names, dtype=object)
    stratum_px = points.mapped_pixels[code]
    stratum_n = points.sample_sizes[code]
    return {
        "id": np.arange(1, len(points) + 1, dtype=np.int64),
        "x": points.x,
        "y": points.y,
        "lon": np.asarray(lon, dtype=np.float64),
        "lat": np.asarray(lat, dtype=np.float64),
        MAP_CODE_COLUMN: code,
        "map_class": names[code] if len(points) else np.zeros(0, dtype=object),
        "stratum_pixels": stratum_px,
        "stratum_sample": stratum_n,
        "stratum_weight": points.weights[code],
        "inclusion_probability": stratum_n / np.maximum(stratum_px, 1),
        REFERENCE_COLUMN: np.full(len(points), None, dtype=object),
    }


def write_sample(points: SamplePoints, path: str | os.PathLike[str], *, overwrite: bool) -> None:
    """Write the points to `path` (.gpkg or .csv) atomically, with an empty reference."""
    suffix = check_sample_suffix(path, option="--out")
    columns = _columns(points)
    if suffix == ".csv":
        write_text_atomic(path, _csv_text(columns), overwrite=overwrite)
        return
    import pyogrio.raw  # type: ignore[import-untyped]  # optional: only GeoPackage needs it
    import shapely

    geometry = shapely.to_wkb(shapely.points(points.x, points.y))

    def write(tmp: str) -> None:
        # GDAL wants the .gpkg suffix on the file it creates; renamed onto the temp name
        staged = f"{tmp}.gpkg"
        Path(staged).unlink(missing_ok=True)
        # the GeoPackage's last_change stamps: fixed, so one seed gives one file, byte for byte
        pyogrio.set_gdal_config_options({"OGR_CURRENT_DATE": GPKG_DATE})
        try:
            _write_gpkg(staged)
        except Exception as exc:
            Path(staged).unlink(missing_ok=True)  # GDAL leaves the half-written file
            if not type(exc).__module__.startswith("pyogrio"):
                raise
            raise OutputError(_gpkg_failure(path, exc)) from None
        finally:
            pyogrio.set_gdal_config_options({"OGR_CURRENT_DATE": None})
        os.replace(staged, tmp)

    def _write_gpkg(staged: str) -> None:
        pyogrio.raw.write(
            staged,
            geometry,
            [columns[name] for name in SAMPLE_COLUMNS],
            fields=list(SAMPLE_COLUMNS),
            crs=points.crs_wkt,
            driver="GPKG",
            geometry_type="Point",
            layer=LAYER,
        )

    write_atomic(path, write, overwrite=overwrite)


def _gpkg_failure(path: str | os.PathLike[str], exc: Exception) -> str:
    """One line for GDAL's failure to write the GeoPackage `path` (it says no errno)."""
    try:
        free: int | None = shutil.disk_usage(Path(path).absolute().parent).free
    except OSError:
        free = None
    if free is not None and free < 1024 * 1024:
        return (
            f"{path}: cannot write it (No space left on device, {free:,} bytes free); free "
            "some space there or choose another output"
        )
    return f"{path}: GDAL could not write the GeoPackage ({reason(exc)}); or write a .csv"


def _csv_text(columns: dict[str, npt.NDArray[np.generic]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(SAMPLE_COLUMNS)
    rows = len(columns["id"])
    for i in range(rows):
        writer.writerow(
            ["" if columns[name][i] is None else _cell(columns[name][i]) for name in SAMPLE_COLUMNS]
        )
    return buffer.getvalue()


# A cell a spreadsheet would read as a formula (CSV injection): text that starts so.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: object) -> str:
    if isinstance(value, float | np.floating):
        return repr(float(value))  # round-trips exactly
    if isinstance(value, str):
        return csv_text(value)
    return str(value)


def csv_text(text: str) -> str:
    """`text` for a CSV cell that a spreadsheet opens: a leading `'` where it would start a
    formula (`=`, `+`, `-`, `@`), so a class name is shown, never run."""
    return "'" + text if text.startswith(_FORMULA_START) else text


def _uncell(text: str) -> str:
    """A cell's text without the `'` that `csv_text` puts before a formula's first sign."""
    return text[1:] if text.startswith("'") and text[1:].startswith(_FORMULA_START) else text


@dataclass(frozen=True, slots=True)
class ReferenceSample:
    """A sample read back: point coordinates in `crs_wkt` (None: a CSV, whose `x`, `y` are
    in the map's CRS, or `lon`/`lat` in WGS 84 when `geographic`) and the reference text
    of each point as the person wrote it ('' where left empty)."""

    path: str
    x: npt.NDArray[np.float64]
    y: npt.NDArray[np.float64]
    crs_wkt: str | None
    geographic: bool
    references: tuple[str, ...]
    has_reference: bool  # whether the file has a reference column at all
    # the `map_code` column as written ('' where blank); None when the file has none
    map_codes: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return int(self.x.shape[0])


def read_reference_sample(path: str) -> ReferenceSample:
    """The points and references of the sample file at `path` (.gpkg or .csv); refuses a
    missing file, one without points or coordinates, in one line."""
    suffix = check_sample_suffix(path, option="--reference")
    if not Path(path).is_file():
        raise EvaluationError(f"--reference {path}: no such file; give the sample to score")
    if suffix == ".csv":
        return _read_csv(path)
    return _read_gpkg(path)


def _read_gpkg(path: str) -> ReferenceSample:
    import pyogrio.raw  # type: ignore[import-untyped]
    import shapely

    try:
        meta, _, geometry, data = pyogrio.raw.read(path)
    except Exception as exc:  # pyogrio's DataSourceError and GDAL's own
        raise EvaluationError(
            f"--reference {path}: cannot read it as a GeoPackage ({reason(exc)})"
        ) from None
    fields = [str(f) for f in meta["fields"]]
    if geometry is None:
        raise EvaluationError(f"--reference {path}: the layer has no point geometry")
    points = shapely.from_wkb(geometry)
    x = shapely.get_x(points).astype(np.float64)
    y = shapely.get_y(points).astype(np.float64)
    references: tuple[str, ...] = ()
    if REFERENCE_COLUMN in fields:
        column = data[fields.index(REFERENCE_COLUMN)]
        references = tuple(_text(v) for v in column)
    return ReferenceSample(
        path=path,
        x=x,
        y=y,
        crs_wkt=meta.get("crs") or None,
        geographic=False,
        references=references if REFERENCE_COLUMN in fields else ("",) * len(x),
        has_reference=REFERENCE_COLUMN in fields,
        map_codes=(
            tuple(_text(v) for v in data[fields.index(MAP_CODE_COLUMN)])
            if MAP_CODE_COLUMN in fields
            else None
        ),
    )


def _text(value: object) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def _read_csv(path: str) -> ReferenceSample:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            # column names as a spreadsheet may leave them: "Reference", " x "
            rows = [
                {(k or "").strip().lower(): v for k, v in row.items()} for row in csv.DictReader(f)
            ]
            header = rows[0].keys() if rows else set()
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise EvaluationError(f"--reference {path}: cannot read it as CSV ({exc})") from None
    if not rows:
        raise EvaluationError(f"--reference {path}: holds no points")
    geographic = not {"x", "y"} <= set(header)
    keys = ("lon", "lat") if geographic else ("x", "y")
    if not set(keys) <= set(header):
        raise EvaluationError(
            f"--reference {path}: needs columns x, y (the map's CRS) or lon, lat (WGS 84); "
            f"found {', '.join(header)}"
        )
    x, y = (np.array([_coordinate(r.get(k)) for r in rows]) for k in keys)
    bad = np.flatnonzero(~(np.isfinite(x) & np.isfinite(y)))
    if bad.size:
        row = rows[int(bad[0])]
        raise EvaluationError(
            f"--reference {path}: row {int(bad[0]) + 1} has {keys[0]} {row.get(keys[0])!r}, "
            f"{keys[1]} {row.get(keys[1])!r}: not numbers ({bad.size} such rows); give every "
            "point its coordinates"
        )
    has = REFERENCE_COLUMN in header
    return ReferenceSample(
        path=path,
        x=x,
        y=y,
        crs_wkt=None,
        geographic=geographic,
        references=tuple(_text(r.get(REFERENCE_COLUMN)) for r in rows),
        has_reference=has,
        map_codes=(
            tuple(_text(r.get(MAP_CODE_COLUMN)) for r in rows)
            if MAP_CODE_COLUMN in header
            else None
        ),
    )


def _coordinate(text: object) -> float:
    """A coordinate cell as a number; NaN when it is blank or not a number."""
    try:
        return float(str(text).strip()) if text is not None else math.nan
    except ValueError:
        return math.nan


def parse_references(sample: ReferenceSample, class_map: ClassMap) -> npt.NDArray[np.int64]:
    """The class code of each point's reference (a code or a class name of `class_map`,
    names case-insensitive); refuses a sample without a reference column, points left
    unlabelled, and labels that name no class, each in one line."""
    if not sample.has_reference:
        raise EvaluationError(
            f"--reference {sample.path}: has no {REFERENCE_COLUMN!r} column; label the points "
            f"in a column named {REFERENCE_COLUMN} (the one `landcover sample` writes) or pass "
            "--reference-raster TRUTH"
        )
    by_name = {c.name.lower(): c.code for c in class_map.classes[1:]}
    k = class_map.num_classes
    codes = np.zeros(len(sample), dtype=np.int64)
    empty: list[int] = []
    unknown: dict[str, None] = {}
    for i, given in enumerate(sample.references):
        text = _uncell(given)
        if not text:
            empty.append(i + 1)
        elif text.lower() in by_name:
            codes[i] = by_name[text.lower()]
        elif (code := _integer(text)) is not None and 1 <= code < k:
            codes[i] = code
        else:
            unknown[text] = None
    if unknown:
        raise EvaluationError(
            f"--reference {sample.path}: references {', '.join(list(unknown)[:5])} name no "
            f"class of {class_map.name!r}; use codes or names: "
            + ", ".join(f"{c.code} ({c.name})" for c in class_map.classes[1:])
        )
    if empty:
        rows = ", ".join(str(r) for r in empty[:5]) + (" ..." if len(empty) > 5 else "")
        raise EvaluationError(
            f"--reference {sample.path}: {len(empty)} of {len(sample)} points have no reference "
            f"(rows {rows}); label every point, or pass --reference-raster TRUTH"
        )
    return codes


def _integer(text: str) -> int | None:
    """The whole number `text` writes ("2", or "2.0" as a spreadsheet may save it), else None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() else None


def references_from_raster(
    xs: npt.NDArray[np.float64],
    ys: npt.NDArray[np.float64],
    crs_wkt: str,
    raster: str,
    class_map: ClassMap,
) -> npt.NDArray[np.int64]:
    """The class code of the truth raster `raster` under each point (its raw values remapped
    with `class_map`); 0 where the raster has nodata or does not reach the point."""
    try:
        with rasterio.open(raster) as ds:
            if ds.crs is None:
                raise EvaluationError(
                    f"--reference-raster {raster}: has no CRS; assign the one it is in"
                )
            to_raster = Transformer.from_crs(
                pyproj.CRS.from_wkt(crs_wkt), pyproj.CRS.from_wkt(ds.crs.to_wkt()), always_xy=True
            )
            rx, ry = to_raster.transform(xs, ys)
            rows, cols = rasterio.transform.rowcol(ds.transform, rx, ry)
            rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
            inside = (rows >= 0) & (rows < ds.height) & (cols >= 0) & (cols < ds.width)
            raw = np.zeros(len(xs), dtype=np.int64)
            nodata = ds.nodata
            raw[inside] = values_at(ds, rows[inside], cols[inside])
    except rasterio.errors.RasterioIOError as exc:
        raise EvaluationError(
            f"--reference-raster {raster}: cannot open it ({reason(exc)})"
        ) from None
    codes = np.full(len(xs), NODATA_CODE, dtype=np.int64)
    codes[inside] = class_map.apply(
        raw[inside],
        nodata=None if nodata is None else int(nodata),
        where=f"--reference-raster {raster}",
    )
    return codes


def sample_in_crs(
    sample: ReferenceSample, crs_wkt: str
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The sample's points in the CRS `crs_wkt` (a CSV's x, y are taken to be in it)."""
    if sample.geographic:
        source = pyproj.CRS.from_epsg(4326)
    elif sample.crs_wkt is None:
        return sample.x, sample.y
    else:
        source = pyproj.CRS.from_user_input(sample.crs_wkt)
    to_map = Transformer.from_crs(source, pyproj.CRS.from_wkt(crs_wkt), always_xy=True)
    x, y = to_map.transform(sample.x, sample.y)
    return np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
