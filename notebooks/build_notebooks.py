"""Write the three landcover notebooks from the cell sources below, without outputs.

    python notebooks/build_notebooks.py          # (re)write notebooks/*.ipynb
    python notebooks/build_notebooks.py --check  # exit 1 if a notebook differs from this script

The notebooks are generated so that what is committed never carries outputs or execution
counts, and so that cell ids are stable (a rebuild of unchanged cells is byte-identical).
tests/test_notebooks.py executes them on tiny sizes (LANDCOVER_NOTEBOOK_SMALL=1).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

Cell = tuple[str, str, str]  # (id, "md" | "code" | "params", source)


def md(cell_id: str, text: str) -> Cell:
    return (cell_id, "md", text)


def code(cell_id: str, text: str) -> Cell:
    return (cell_id, "code", text)


def params(cell_id: str, text: str) -> Cell:
    return (cell_id, "params", text)


# ---------------------------------------------------------------------------------------------
# Shared cell text. Every notebook stays self-contained: these snippets are copied into each.

SIZE_PARAMETERS = """\
# Parameters. The test suite sets LANDCOVER_NOTEBOOK_SMALL=1 to run this on tiny sizes;
# each size can also be set on its own (LANDCOVER_NOTEBOOK_SCENES=9 jupyter lab ...).
import os
from pathlib import Path

SMALL = os.environ.get("LANDCOVER_NOTEBOOK_SMALL", "0") not in ("", "0")


def setting(name: str, default: int, small: int) -> int:
    return int(os.environ.get(f"LANDCOVER_NOTEBOOK_{name}", small if SMALL else default))


SCENES = setting("SCENES", 4, 2)  # synthetic scenes, in a grid of ceil(sqrt(SCENES)) columns
SIZE_PX = setting("SIZE_PX", 1000, 328)  # scene side; not a multiple of the chip on purpose
CHIP_SIZE = setting("CHIP_SIZE", 128, 64)
SPLIT_BLOCK_CHIPS = setting("SPLIT_BLOCK_CHIPS", 4, 2)  # val split = blocks of N x N chips
"""

TRAIN_PARAMETERS = """\
EPOCHS = setting("EPOCHS", 6, 2)
BATCH_SIZE = setting("BATCH_SIZE", 8, 8)
WORKERS = (1, 2)  # the scaling sweep's worker counts (local engine: processes on this machine)
MODEL = "small_unet"
HELD_OUT_SCENE = 1  # the top-right scene is never tiled: the map is scored on unseen land
"""

WORK_PARAMETERS = """\
SEED = 0
WORK = Path(os.environ.get("LANDCOVER_NOTEBOOK_WORK", "notebook-work"))
"""

CLASS_HELPERS = """\
def stretch(bands: np.ndarray) -> np.ndarray:
    \"\"\"(3, H, W) digital numbers -> (H, W, 3) floats in 0..1, a 2-98 % stretch per band.\"\"\"
    bands = bands.astype(np.float32)
    lo, hi = np.percentile(bands, (2, 98), axis=(1, 2), keepdims=True)
    return np.clip((bands - lo) / np.maximum(hi - lo, 1.0), 0.0, 1.0).transpose(1, 2, 0)


def show_classes(ax, codes: np.ndarray, class_map, **kwargs) -> None:
    \"\"\"Class codes in the class table's colours; code 0 (nodata) transparent.\"\"\"
    cmap = ListedColormap(matplotlib_colors(class_map))
    ax.imshow(
        np.ma.masked_equal(codes, 0),
        cmap=cmap,
        vmin=-0.5,
        vmax=class_map.num_classes - 0.5,
        interpolation="nearest",
        **kwargs,
    )


def class_legend(fig_or_ax, class_map, **kwargs) -> None:
    colors = matplotlib_colors(class_map)[1:]
    names = class_map.class_names[1:]
    handles = [Patch(color=c, label=n) for c, n in zip(colors, names, strict=True)]
    fig_or_ax.legend(handles=handles, frameon=False, **kwargs)
"""


# ---------------------------------------------------------------------------------------------
# 01: scenes, labels, chips

NOTEBOOK_01: list[Cell] = [
    md(
        "title",
        """\
# 1 · Scenes, labels and chips

What the model learns from. This notebook

1. synthesises a few NAIP-like scenes with Chesapeake-style 1 m land-cover labels and looks at
   them in true colour, in false colour (NIR-R-G) and as a label map;
2. cuts them into a Zarr chip store (what `landcover tile` does) and reads the store back: its
   summary, class balance, band statistics, some chips, and where the spatial validation blocks
   lie;
3. opens a **real** NAIP file, one of those whose NIR band is tagged as *alpha*, to see why the
   tiler never lets GDAL treat that band as a mask.""",
    ),
    params("parameters", SIZE_PARAMETERS + "\n" + WORK_PARAMETERS),
    code(
        "imports",
        """\
%matplotlib inline
import logging

import matplotlib.pyplot as plt
import numpy as np
import rasterio
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch, Rectangle
from rasterio.merge import merge
from rasterio.plot import plotting_extent

from landcover.classes import get_class_map, matplotlib_colors
from landcover.commands.tiling import describe_summary
from tiling.sources import open_image
from tiling.store import open_store
from tiling.synth import SynthConfig, synthesize_scenes
from tiling.tile import TileConfig, tile

logging.basicConfig(level=logging.WARNING)
OUT = WORK / "01-tile-naip"
OUT.mkdir(parents=True, exist_ok=True)
print(f"working in {OUT.resolve()}")""",
    ),
    code("helpers", CLASS_HELPERS),
    md(
        "synth-md",
        """\
## Synthesise scenes

`synthesize_scenes` cuts adjacent scenes out of one continuous synthetic landscape (fields,
forests, rivers, roads, houses), so features run across scene edges the way they do across
NAIP quarter-quads. Each scene is a 4-band uint8 GeoTIFF (R, G, B, NIR) at 1 m in UTM 18N, with
a label raster in the Chesapeake 1 m scheme (water, tree canopy, low vegetation, barren,
impervious, roads).""",
    ),
    code(
        "synth",
        """\
synth = synthesize_scenes(
    SynthConfig(out_dir=OUT / "data", scenes=SCENES, size_px=SIZE_PX, seed=SEED)
)
for image, labels in zip(synth.image_paths, synth.label_paths, strict=True):
    print(f"{image.name}  +  {labels.name}")
print(f"CRS {synth.crs}, bounds {synth.bounds}")""",
    ),
    md(
        "mosaic-md",
        """\
The scenes side by side. True colour shows what a person sees; false colour puts NIR in the
red channel, so healthy vegetation glows red and water turns black: the band the model leans
on most to tell crops from pavement and water from shadow.""",
    ),
    code(
        "mosaic",
        """\
chesapeake = get_class_map("chesapeake7")  # the raw label codes (15 = nodata)
image_mosaic, mosaic_transform = merge([str(p) for p in synth.image_paths])
raw_mosaic, _ = merge([str(p) for p in synth.label_paths])
label_mosaic = chesapeake.apply(raw_mosaic[0])
extent = plotting_extent(image_mosaic[0], mosaic_transform)

aspect = image_mosaic.shape[1] / image_mosaic.shape[2]
fig, axes = plt.subplots(1, 3, figsize=(16, 16 / 3 * aspect + 1.4), sharex=True, sharey=True)
axes[0].imshow(stretch(image_mosaic[[0, 1, 2]]), extent=extent)
axes[0].set_title("true colour (R, G, B)")
axes[1].imshow(stretch(image_mosaic[[3, 0, 1]]), extent=extent)
axes[1].set_title("false colour (NIR, R, G)")
show_classes(axes[2], label_mosaic, chesapeake, extent=extent)
axes[2].set_title("labels (Chesapeake 1 m classes)")
for path, ax in [(p, a) for p in synth.image_paths for a in axes]:
    with rasterio.open(path) as ds:
        left, bottom, right, top = ds.bounds
    ax.add_patch(Rectangle((left, bottom), right - left, top - bottom, fill=False, color="w", lw=1))
for ax in axes:
    ax.ticklabel_format(useOffset=False, style="plain")
    ax.tick_params(axis="x", labelrotation=20)
    ax.set_xlabel("easting (m)")
axes[0].set_ylabel("northing (m)")
class_legend(fig, chesapeake, loc="lower center", ncol=6)
fig.tight_layout(rect=(0, 0.07, 1, 1))""",
    ),
    md(
        "zoom-md",
        """\
At full resolution (a 200 m square of the first scene): houses with shadows, roads, field
texture and tree crowns.""",
    ),
    code(
        "zoom",
        """\
side = min(200, SIZE_PX)
row0 = col0 = max(0, SIZE_PX // 2 - side // 2)
crop = np.s_[row0 : row0 + side, col0 : col0 + side]
with rasterio.open(synth.image_paths[0]) as ds, rasterio.open(synth.label_paths[0]) as lds:
    window = rasterio.windows.Window(col0, row0, side, side)
    pixels, raw = ds.read(window=window), lds.read(1, window=window)

fig, axes = plt.subplots(1, 3, figsize=(13, 4.6))
axes[0].imshow(stretch(pixels[[0, 1, 2]]))
axes[1].imshow(stretch(pixels[[3, 0, 1]]))
show_classes(axes[2], chesapeake.apply(raw), chesapeake)
for ax, title in zip(axes, ["true colour", "false colour", "labels"], strict=True):
    ax.set_title(title)
    ax.set_axis_off()
class_legend(fig, chesapeake, loc="lower center", ncol=6)
fig.tight_layout(rect=(0, 0.08, 1, 1))""",
    ),
    md(
        "tile-md",
        """\
## Tile into a chip store

`tile` (the library behind `landcover tile`) cuts every scene into `CHIP_SIZE` px chips, warps
the labels onto each image's pixel grid, remaps the raw Chesapeake codes onto the store's class
table (`chesapeake7to5`: barren, buildings and roads merge into one class), drops chips with too
little valid data and appends everything to a sharded Zarr v3 store. Band means and standard
deviations are summed exactly while tiling, so training and prediction normalise identically.

The validation split is **spatial**: whole blocks of `SPLIT_BLOCK_CHIPS` x `SPLIT_BLOCK_CHIPS`
chips go to validation, never single chips, so validation chips do not sit right next to
training chips that share their fields and houses.""",
    ),
    code(
        "tile",
        """\
store_url = str(OUT / "chips.zarr")
tiled = tile(
    TileConfig(
        images=tuple(str(p) for p in synth.image_paths),
        labels=(str(OUT / "data" / "labels"),),
        out=store_url,
        chip_size=CHIP_SIZE,
        shard_size=32,
        val_fraction=0.2,
        split_block_chips=SPLIT_BLOCK_CHIPS,
        overwrite=True,  # rerunning the notebook replaces the store
    )
)
print(f"wrote {tiled.chips_written} chips in {tiled.elapsed_s:.1f} s ({tiled.workers} threads)")""",
    ),
    md(
        "info-md",
        """\
## What is in the store

The same summary `landcover info chips.zarr` prints: chips and splits, band statistics, the
class table with pixel counts, and the sources.""",
    ),
    code(
        "info",
        """\
store = open_store(store_url)
summary = store.summary
class_map = summary.class_map
print("\\n".join(describe_summary(store_url, summary, store.stored_bytes())))""",
    ),
    md(
        "balance-md",
        """\
Class balance per split (do the validation blocks see every class?), and the pixel-value
distribution of each band with the stored mean (dashed) that training subtracts.""",
    ),
    code(
        "balance",
        """\
train_ids, val_ids = store.chip_ids("train"), store.chip_ids("val")
train_images, train_labels = store.read_chips(train_ids)
_, val_labels = store.read_chips(val_ids)
k = class_map.num_classes


def class_share(labels: np.ndarray) -> np.ndarray:
    counts = np.bincount(labels.ravel(), minlength=k)[1:].astype(float)
    return counts / max(counts.sum(), 1.0)


fig, (ax_classes, ax_bands) = plt.subplots(1, 2, figsize=(14, 4.2))
x = np.arange(1, k)
colors = matplotlib_colors(class_map)[1:]
ax_classes.bar(
    x - 0.2,
    class_share(train_labels),
    0.4,
    color=colors,
    edgecolor="k",
    label=f"train ({len(train_ids)} chips)",
)
ax_classes.bar(
    x + 0.2,
    class_share(val_labels),
    0.4,
    color=colors,
    edgecolor="k",
    hatch="//",
    label=f"val ({len(val_ids)} chips)",
)
ax_classes.set_xticks(x, class_map.class_names[1:], rotation=15)
ax_classes.set_ylabel("share of labelled pixels")
ax_classes.set_title("class balance per split")
ax_classes.legend(frameon=False)

band_colors = ["tab:red", "tab:green", "tab:blue", "tab:purple"]
for band, (name, color) in enumerate(zip(summary.bands, band_colors, strict=True)):
    values = train_images[:, band].ravel()
    ax_bands.hist(values, bins=64, range=(0, 255), histtype="step", color=color, label=name)
    ax_bands.axvline(summary.band_mean[band], color=color, ls="--", lw=1)
ax_bands.set_xlabel("digital number")
ax_bands.set_ylabel("pixels")
ax_bands.set_title("band values (train chips); dashed: stored mean")
ax_bands.legend(frameon=False)
fig.tight_layout()""",
    ),
    md(
        "chips-md",
        """\
## Chips with their labels

A few training and validation chips as the model sees them (before normalisation), with their
labels in the store's class table.""",
    ),
    code(
        "chips",
        """\
rng = np.random.default_rng(SEED)
per_split = 4
picks = np.concatenate(
    [
        rng.choice(train_ids, min(per_split, len(train_ids)), replace=False),
        rng.choice(val_ids, min(per_split, len(val_ids)), replace=False),
    ]
)
chip_images, chip_labels = store.read_chips(picks)
index = store.index()  # source_id, row_px, col_px, split

fig, axes = plt.subplots(2, len(picks), figsize=(2.1 * len(picks), 4.6), squeeze=False)
for column, chip_id in enumerate(picks):
    source, row, col, split = index[chip_id]
    axes[0, column].imshow(stretch(chip_images[column, :3]))
    axes[0, column].set_title(
        f"#{chip_id} {'val' if split else 'train'}\\nscene {source} @ ({row}, {col})", fontsize=8
    )
    show_classes(axes[1, column], chip_labels[column], class_map)
for ax in axes.ravel():
    ax.set_axis_off()
class_legend(fig, class_map, loc="lower center", ncol=4)
fig.tight_layout(rect=(0, 0.08, 1, 1))""",
    ),
    md(
        "split-md",
        """\
## Where the validation blocks are

Every chip of every scene, outlined where it was cut; validation chips filled orange. Blocks,
not single chips, so the split is spatial. Chips that fell below `min_valid` are missing.""",
    ),
    code(
        "split",
        """\
sources = summary.sources
columns = min(len(sources), 4)
rows = -(-len(sources) // columns)
fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 4.4 * rows), squeeze=False)
for ax, source in zip(axes.ravel(), sources, strict=False):
    with rasterio.open(source.path) as ds:
        ax.imshow(stretch(ds.read([1, 2, 3])))
    for _, row, col, split in index[index[:, 0] == source.id]:
        ax.add_patch(
            Rectangle(
                (col, row),
                summary.chip_size,
                summary.chip_size,
                facecolor=(1.0, 0.55, 0.0, 0.45) if split else "none",
                edgecolor="orange" if split else "white",
                lw=0.8,
            )
        )
    ax.set_title(
        f"scene {source.id}: {source.train_chips} train, {source.val_chips} val", fontsize=9
    )
    ax.set_axis_off()
for ax in axes.ravel()[len(sources) :]:
    ax.set_visible(False)
fig.tight_layout()""",
    ),
    md(
        "real-md",
        """\
## A real NAIP file

The repository ships six real NAIP GeoTIFFs in `tests/data/naip-real` (test files of
stactools-packages/naip, Apache-2.0). Two of them tag their 4th band, NIR, as **alpha**. GDAL
then offers that band as the dataset's validity mask, and anything that displays RGBA uses it
as transparency, although it is a measurement like the other three. The tiler reads validity
from a nodata value or an internal mask, never from alpha; a file that declares neither, like
this one, gets the zero rule (`'zero'`): pixels that are 0 in all four bands, the black collar
of reprojected tiles, are nodata.""",
    ),
    code(
        "real-find",
        """\
def find_repo_root() -> Path:
    \"\"\"The checkout: run from notebooks/ or from the repository root, or wherever the
    editable install points.\"\"\"
    for base in (Path.cwd(), *Path.cwd().parents):
        if (base / "pyproject.toml").is_file() and (base / "landcover").is_dir():
            return base
    import landcover

    return Path(landcover.__file__).resolve().parents[1]


NAIP_REAL = find_repo_root() / "tests" / "data" / "naip-real"
if not NAIP_REAL.is_dir():
    raise FileNotFoundError(
        f"{NAIP_REAL.resolve()}: real NAIP files missing; they ship under tests/data"
    )
real_path = NAIP_REAL / "m_3211605_ne_11_060_20200415.tif"
with rasterio.open(real_path) as ds:
    print(f"{real_path.name}: {ds.width} x {ds.height} px at {ds.res[0]:.2f} m, {ds.crs}")
    print("colour interpretation:", [c.name for c in ds.colorinterp])
    print("mask flags per band:  ", [[f.name for f in flags] for flags in ds.mask_flag_enums])
    pixels = ds.read()  # all four bands, read as data
    gdal_mask = ds.read_masks(1)  # what GDAL would hand out as band 1's validity mask
print(
    "GDAL's 'mask' for the RGB bands is the NIR band itself:", np.array_equal(gdal_mask, pixels[3])
)
print("validity as the tiler reads it:", repr(open_image(str(real_path)).mask_kind))""",
    ),
    code(
        "real-show",
        """\
fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
axes[0].imshow(stretch(pixels[[0, 1, 2]]))
axes[0].set_title("true colour (R, G, B)")
axes[1].imshow(stretch(pixels[[3, 0, 1]]))
axes[1].set_title("false colour (NIR, R, G)")
shown = axes[2].imshow(pixels[3], cmap="magma")
fig.colorbar(shown, ax=axes[2], fraction=0.04)
axes[2].set_title("band 4: NIR (tagged alpha)")
axes[3].imshow(np.moveaxis(pixels, 0, -1))  # RGBA: NIR becomes transparency
axes[3].set_title("the pitfall: shown as RGBA")
for ax in axes:
    ax.set_axis_off()
fig.tight_layout()""",
    ),
    md(
        "real-tile-md",
        """\
Tiled into an images-only store, every chip holds exactly the file's pixels, NIR included: the
band went in as data and no pixel was masked away.""",
    ),
    code(
        "real-tile",
        """\
real_url = str(OUT / "real.zarr")
tile(TileConfig(images=(str(real_path),), out=real_url, chip_size=64, overwrite=True))
real_store = open_store(real_url)
real_chips, _ = real_store.read_chips(real_store.chip_ids("all"))
same = all(
    np.array_equal(chip, pixels[:, row : row + 64, col : col + 64])
    for chip, (_, row, col, _) in zip(real_chips, real_store.index(), strict=True)
)
print(f"{real_store.summary.num_chips} chips (images only: {not real_store.summary.has_labels})")
print("every chip equals the file's pixels in all four bands:", same)""",
    ),
]


# ---------------------------------------------------------------------------------------------
# 02: training and scaling

NOTEBOOK_02: list[Cell] = [
    md(
        "title",
        """\
# 2 · Train and scale

Train a small U-Net on synthetic NAIP chips at 1 and at 2 workers through the **cluster sweep**
on the local engine (torchrun on this machine: the same launch path as Azure ML or Kubernetes,
with another `cluster.json`), then look at learning curves, the scaling table, and the scaling
report with its projection to larger clusters.

One scene (the top-right one) is synthesised but never tiled: notebook 3 scores the map on
it. Notebook 3 reuses what this one leaves in `WORK`.""",
    ),
    params("parameters", SIZE_PARAMETERS + TRAIN_PARAMETERS + "\n" + WORK_PARAMETERS),
    code(
        "imports",
        """\
%matplotlib inline
import json
import logging

import matplotlib.pyplot as plt
from IPython.display import Image, Markdown, display

from cluster.spec import local_spec
from cluster.sweep import SweepConfig, format_sweep_table, run_sweep
from landcover.report import build_scaling_report, report_markdown, write_scaling_report
from landcover.runs import load_runs
from landcover.train import read_metrics
from tiling.synth import SynthConfig, synthesize_scenes
from tiling.tile import TileConfig, tile

logging.basicConfig(level=logging.WARNING)
WORK.mkdir(parents=True, exist_ok=True)
print(f"working in {WORK.resolve()}")""",
    ),
    md(
        "data-md",
        """\
## Data: scenes and a chip store

As in notebook 1, but the held-out scene stays out of the store.""",
    ),
    code(
        "data",
        """\
synth = synthesize_scenes(
    SynthConfig(out_dir=WORK / "data", scenes=SCENES, size_px=SIZE_PX, seed=SEED)
)
train_scenes = [p for i, p in enumerate(synth.image_paths) if i != HELD_OUT_SCENE]
store_url = str(WORK / "chips.zarr")
tiled = tile(
    TileConfig(
        images=tuple(str(p) for p in train_scenes),
        labels=(str(WORK / "data" / "labels"),),
        out=store_url,
        chip_size=CHIP_SIZE,
        shard_size=32,
        val_fraction=0.2,
        split_block_chips=SPLIT_BLOCK_CHIPS,
        overwrite=True,
    )
)
s = tiled.summary
print(
    f"{len(train_scenes)} of {SCENES} scenes tiled: {s.num_chips} chips of {s.chip_size} px "
    f"(train {s.num_train}, val {s.num_val})"
)""",
    ),
    md(
        "sweep-md",
        """\
## Train at 1 and 2 workers

`run_sweep` launches one training job per worker count on the cluster described by a
`ClusterSpec`: here `local_spec`, this machine, one node with N processes (gloo on CPU). Every
worker loads its shard of the store into RAM once, then trains with synchronous DDP; rank 0
writes `metrics.jsonl`, `run.json`, checkpoints and the self-describing `model.pt`. The
per-worker batch is fixed, so at 2 workers each epoch has half the steps.""",
    ),
    code(
        "sweep",
        """\
sweep = run_sweep(
    SweepConfig(
        store=store_url,
        workers=WORKERS,
        epochs=EPOCHS,
        out_dir=str(WORK / "scaling"),
        extra_args=("--model", MODEL, "--batch-size", str(BATCH_SIZE), "--seed", str(SEED)),
        cluster=local_spec(max(WORKERS)),
        overwrite=True,  # rerunning the notebook retrains
    )
)
for run in sweep.failed:
    logs = sweep.path.parent / (run.log_dir or "")
    tails = [p.read_text()[-3000:] for p in sorted(logs.glob("*.log"))] if logs.is_dir() else []
    message = f"training at {run.workers} workers failed: {run.error}"
    raise RuntimeError("\\n".join([message, *tails]))
print(format_sweep_table(sweep))""",
    ),
    md(
        "curves-md",
        """\
## Learning curves

Training loss and validation mIoU per epoch, one line per worker count. Both runs see the
same chips each epoch, split differently; with the learning rate scaled linearly with the
number of workers the curves should roughly agree.""",
    ),
    code(
        "curves",
        """\
run_dirs = {run.workers: sweep.path.parent / run.run_dir for run in sweep.runs}
fig, (ax_loss, ax_iou) = plt.subplots(1, 2, figsize=(12, 4))
for workers, run_dir in run_dirs.items():
    metrics = read_metrics(run_dir)
    epochs = [m["epoch"] for m in metrics]
    label = f"{workers} worker{'s' if workers > 1 else ''}"
    ax_loss.plot(epochs, [m["train_loss"] for m in metrics], "o-", label=f"{label}: train")
    ax_loss.plot(epochs, [m["val_loss"] for m in metrics], "o--", label=f"{label}: val")
    ax_iou.plot(epochs, [m["val_miou"] for m in metrics], "o-", label=label)
ax_loss.set(xlabel="epoch", ylabel="loss", title="loss")
ax_iou.set(xlabel="epoch", ylabel="mIoU", title="validation mean IoU", ylim=(0, 1))
for ax in (ax_loss, ax_iou):
    ax.legend(frameon=False)
    ax.grid(alpha=0.3)
fig.tight_layout()

last = read_metrics(run_dirs[max(run_dirs)])[-1]
print(
    f"last epoch at {last['world_size']} workers: val mIoU {last['val_miou']:.3f}, "
    f"accuracy {last['val_accuracy']:.3f}"
)
per_class = [f"{v:.2f}" if v is not None else "-" for v in last["per_class_iou"]]
print("per-class IoU (code 0 = nodata):", per_class)""",
    ),
    md(
        "report-md",
        """\
## Scaling report

`write_scaling_report` reads the run directories (`load_runs`), fits a power law of epoch time
against workers, projects to larger clusters with a ring all-reduce model, and writes
`report.md`, `report.html` and the PNGs. On a 2-core machine the numbers say more about the
machine than about the method: two workers share two cores, and the first epoch (warm-up) is
left out of the medians. The projection is labelled PROJECTED because it is a model, not a
measurement.""",
    ),
    code(
        "report",
        """\
runs = load_runs([WORK / "scaling"])
paths = write_scaling_report(runs, WORK / "report", overwrite=True)
display(Markdown(report_markdown(build_scaling_report(runs))))""",
    ),
    code(
        "report-figures",
        """\
for image in paths.images:
    print(image.name)
    display(Image(filename=str(image)))""",
    ),
    md(
        "handoff-md",
        """\
## Hand-off to notebook 3

The scenes, the held-out scene and the model of the largest run, for the prediction notebook.""",
    ),
    code(
        "handoff",
        """\
model_path = run_dirs[max(run_dirs)] / "model.pt"
handoff = {
    "images": [str(p.resolve()) for p in synth.image_paths],
    "labels": [str(p.resolve()) for p in synth.label_paths],
    "held_out_scene": HELD_OUT_SCENE,
    "size_px": SIZE_PX,
    "store": str(Path(store_url).resolve()),
    "model": str(model_path.resolve()),
}
(WORK / "pipeline.json").write_text(json.dumps(handoff, indent=1))
print(json.dumps(handoff, indent=1))""",
    ),
]


# ---------------------------------------------------------------------------------------------
# 03: predict a region and evaluate

NOTEBOOK_03: list[Cell] = [
    md(
        "title",
        """\
# 3 · Predict a region and evaluate

Draw a region across two scenes, one seen in training and one held out, predict a land-cover
map for it with the trained model, and compare the map with the truth.

If notebook 2 ran with the same `WORK` directory, its model and scenes are reused; otherwise
this notebook makes its own (synthesise, tile, train a single process for a few epochs).""",
    ),
    params("parameters", SIZE_PARAMETERS + TRAIN_PARAMETERS + "\n" + WORK_PARAMETERS),
    code(
        "imports",
        """\
%matplotlib inline
import json
import logging

import matplotlib.pyplot as plt
import numpy as np
import pyproj
import rasterio
import shapely
from IPython.display import Image, Markdown, display
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch
from rasterio.enums import Resampling
from rasterio.plot import plotting_extent
from rasterio.warp import reproject
from shapely.geometry import Polygon, mapping

from landcover.classes import matplotlib_colors
from landcover.evaluate import EvaluateConfig, evaluate_prediction, write_report
from landcover.modelfile import read_model_file
from landcover.predict import PredictConfig, predict_region
from landcover.region import parse_region
from landcover.train import TrainConfig, train
from tiling.synth import SynthConfig, synthesize_scenes
from tiling.tile import TileConfig, tile

logging.basicConfig(level=logging.WARNING)
WORK.mkdir(parents=True, exist_ok=True)
print(f"working in {WORK.resolve()}")""",
    ),
    code("helpers", CLASS_HELPERS),
    md(
        "model-md",
        """\
## A trained model

Notebook 2's hand-off file names the scenes and the model; without it, train one here. A
single process is enough for a map: `train` is the same function every DDP worker runs.""",
    ),
    code(
        "model",
        """\
handoff_path = WORK / "pipeline.json"
handoff = json.loads(handoff_path.read_text()) if handoff_path.exists() else None
if handoff is not None and all(Path(p).exists() for p in [handoff["model"], *handoff["images"]]):
    print(f"reusing notebook 2's model and scenes ({handoff_path})")
else:
    print("no finished notebook 2 here: synthesising, tiling and training")
    out = WORK / "03-own"
    synth = synthesize_scenes(
        SynthConfig(out_dir=out / "data", scenes=SCENES, size_px=SIZE_PX, seed=SEED)
    )
    store_url = str(out / "chips.zarr")
    tile(
        TileConfig(
            images=tuple(str(p) for i, p in enumerate(synth.image_paths) if i != HELD_OUT_SCENE),
            labels=(str(out / "data" / "labels"),),
            out=store_url,
            chip_size=CHIP_SIZE,
            shard_size=32,
            val_fraction=0.2,
            split_block_chips=SPLIT_BLOCK_CHIPS,
            overwrite=True,
        )
    )
    result = train(
        TrainConfig(
            store_url=store_url,
            out_dir=str(out / "run"),
            model=MODEL,
            epochs=EPOCHS,
            batch_size=BATCH_SIZE,
            seed=SEED,
            overwrite=True,
        )
    )
    print(f"trained {result.epochs_completed} epochs, best val mIoU {result.best_val_miou:.3f}")
    handoff = {
        "images": [str(p.resolve()) for p in synth.image_paths],
        "labels": [str(p.resolve()) for p in synth.label_paths],
        "held_out_scene": HELD_OUT_SCENE,
        "size_px": SIZE_PX,
        "store": str(Path(store_url).resolve()),
        "model": str((result.run_dir / "model.pt").resolve()),
    }
images, labels = handoff["images"], handoff["labels"]
held_out = handoff["held_out_scene"]
meta, _ = read_model_file(handoff["model"])
class_map = meta.class_map
print(
    f"model: {meta.architecture}, {meta.chip_size} px chips at {meta.resolution_m:g} m, "
    f"classes {class_map.class_names[1:]}"
)""",
    ),
    md(
        "region-md",
        """\
## A region across two scenes

A hexagon over the seam between the first scene and the held-out one, written as GeoJSON in
WGS 84 the way a person would draw it on a web map. `parse_region` also takes a bbox or WKT in
any CRS.""",
    ),
    code(
        "region",
        """\
with rasterio.open(images[0]) as seen, rasterio.open(images[held_out]) as unseen:
    crs = seen.crs
    left, bottom, right, top = seen.bounds
    if unseen.bounds.left != right:
        raise ValueError(f"{images[held_out]} is not the east neighbour of {images[0]}")
width = right - left
seam_x, cy = right, top - width / 2
rx, ry = 0.45 * width, 0.4 * width
hexagon = Polygon(
    [
        (seam_x - rx, cy),
        (seam_x - rx / 2, cy + ry),
        (seam_x + rx / 2, cy + ry),
        (seam_x + rx, cy),
        (seam_x + rx / 2, cy - ry),
        (seam_x - rx / 2, cy - ry),
    ]
)
to_wgs84 = pyproj.Transformer.from_crs(crs, "EPSG:4326", always_xy=True).transform
region_path = WORK / "region.geojson"
feature = {
    "type": "Feature",
    "properties": {"name": "across two scenes"},
    "geometry": mapping(shapely.transform(hexagon, to_wgs84, interleaved=False)),
}
region_path.write_text(json.dumps({"type": "FeatureCollection", "features": [feature]}))
region = parse_region(str(region_path))
print(f"region in {region.crs.to_string()}: bounds {tuple(round(v, 5) for v in region.bounds)}")""",
    ),
    md(
        "predict-md",
        """\
## Predict

`predict_region` finds the scenes the region touches, runs the model over overlapping windows,
blends the overlapping logits with a smooth window (no seams at window or scene edges), and
writes a tiled COG with overviews, a colour table, the class names, and nodata outside the
region; optionally the class probabilities too.""",
    ),
    code(
        "predict",
        """\
prediction = predict_region(
    PredictConfig(
        model=handoff["model"],
        images=tuple(images),
        out=str(WORK / "landcover.tif"),
        region=region,
        probabilities=str(WORK / "probabilities.tif"),
        overwrite=True,
    )
)
grid = prediction.grid
print(
    f"{prediction.out}: {grid.width} x {grid.height} px at {grid.resolution:g} m from "
    f"{len(prediction.sources)} scenes, {prediction.windows} windows in "
    f"{prediction.elapsed_s:.1f} s"
)
for name, pixels in zip(class_map.class_names[1:], prediction.class_pixels[1:], strict=True):
    print(f"  {name:<22} {pixels:>10,d} px")""",
    ),
    md(
        "compare-md",
        """\
## Map, imagery and truth on the same grid

The imagery and the truth are warped onto the prediction's grid, so the panels share one
extent; the region's outline is drawn on each. The last panel shows where the map agrees with
the truth. The seam between the two scenes runs down the middle: the right half is land the
model never saw.""",
    ),
    code(
        "compare",
        """\
def on_grid(paths, bands, resampling, fill):
    \"\"\"The rasters at `paths` warped onto the prediction grid, first one wins.\"\"\"
    out = np.full((len(bands), grid.height, grid.width), fill, dtype=np.uint8)
    for path in paths:
        with rasterio.open(path) as ds:
            part = np.full_like(out, fill)
            for i, band in enumerate(bands):
                reproject(
                    rasterio.band(ds, band),
                    part[i],
                    dst_transform=grid.transform,
                    dst_crs=grid.crs,
                    resampling=resampling,
                    src_nodata=ds.nodata,
                    dst_nodata=fill,
                )
        empty = (out == fill).all(axis=0) & (part != fill).any(axis=0)
        out[:, empty] = part[:, empty]
    return out


with rasterio.open(prediction.out) as ds:
    predicted = ds.read(1)
imagery = on_grid(images, [1, 2, 3, 4], Resampling.bilinear, 0)
truth = class_map.apply(on_grid(labels, [1], Resampling.nearest, 15)[0])
inside = predicted > 0
extent = plotting_extent(predicted, grid.transform)
outline = region.to_crs(grid.crs).geometry

fig, axes = plt.subplots(1, 4, figsize=(20, 5.4), sharex=True, sharey=True)
axes[0].imshow(stretch(imagery[[0, 1, 2]]), extent=extent)
axes[0].set_title("imagery (true colour)")
show_classes(axes[1], truth, class_map, extent=extent)
axes[1].set_title("truth")
show_classes(axes[2], predicted, class_map, extent=extent)
axes[2].set_title("prediction")
agreement = np.where(~inside | (truth == 0), np.nan, (predicted == truth).astype(float))
axes[3].imshow(
    agreement,
    cmap=ListedColormap(["#d62728", "#2ca02c"]),
    vmin=0,
    vmax=1,
    extent=extent,
    interpolation="nearest",
)
axes[3].set_title("agreement (green) / error (red)")
for ax in axes:
    for polygon in getattr(outline, "geoms", [outline]):
        ax.plot(*polygon.exterior.xy, color="k", lw=1)
    ax.axvline(seam_x, color="w", ls=":", lw=1)
    ax.ticklabel_format(useOffset=False, style="plain")
    ax.tick_params(axis="x", labelrotation=20)
    ax.set_xlabel("easting (m)")
axes[0].set_ylabel("northing (m)")
class_legend(fig, class_map, loc="lower center", ncol=4)
fig.tight_layout(rect=(0, 0.07, 1, 1))""",
    ),
    md(
        "confidence-md",
        """\
How sure the model is: the highest class probability per pixel. Low confidence tends to sit
on class boundaries and on surfaces the classes share (dark roofs and asphalt, soil and
concrete).""",
    ),
    code(
        "confidence",
        """\
with rasterio.open(prediction.probabilities) as ds:
    probabilities = ds.read().astype(np.float32) * np.array(ds.scales, np.float32)[:, None, None]
confidence = np.where(inside, probabilities.max(axis=0), np.nan)
fig, ax = plt.subplots(figsize=(6.5, 5))
shown = ax.imshow(
    confidence, cmap="viridis", vmin=1 / (class_map.num_classes - 1), vmax=1, extent=extent
)
fig.colorbar(shown, ax=ax, label="max class probability")
ax.axvline(seam_x, color="w", ls=":", lw=1)
ax.ticklabel_format(useOffset=False, style="plain")
ax.tick_params(axis="x", labelrotation=20)
ax.set(title="model confidence", xlabel="easting (m)", ylabel="northing (m)")
fig.tight_layout()""",
    ),
    md(
        "evaluate-md",
        """\
## Evaluate

`evaluate_prediction` (the library behind `landcover evaluate`) remaps the truth rasters onto
the model's class table, compares them pixel by pixel inside the map, and reports per-class
IoU, precision, recall and F1, pixel accuracy and the confusion matrix. First the whole region,
then the held-out scene alone: the honest number.""",
    ),
    code(
        "evaluate",
        """\
evaluation = evaluate_prediction(EvaluateConfig(prediction=prediction.out, truth=tuple(labels)))
held_out_evaluation = evaluate_prediction(
    EvaluateConfig(prediction=prediction.out, truth=(labels[held_out],))
)
write_report(evaluation, WORK / "evaluation", overwrite=True)
write_report(held_out_evaluation, WORK / "evaluation" / "held-out-scene", overwrite=True)
display(Markdown("### Whole region\\n\\n" + evaluation.to_markdown()))
display(Markdown("### Held-out scene only\\n\\n" + held_out_evaluation.to_markdown()))""",
    ),
    md(
        "confusion-md",
        """\
The confusion matrices `write_report` drew (rows: truth, normalised per row; numbers: pixel
counts), for the whole region and for the held-out scene.""",
    ),
    code(
        "confusion",
        """\
for name in ["evaluation", "evaluation/held-out-scene"]:
    print(name)
    display(Image(filename=str(WORK / name / "confusion.png")))""",
    ),
]


NOTEBOOKS: dict[str, list[Cell]] = {
    "01_tile_naip.ipynb": NOTEBOOK_01,
    "02_train_and_scale.ipynb": NOTEBOOK_02,
    "03_predict_region.ipynb": NOTEBOOK_03,
}


def build(cells: list[Cell]) -> Any:
    """A v4 notebook without outputs, with stable cell ids and a parameters tag."""
    notebook = new_notebook()  # type: ignore[no-untyped-call]
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    notebook.metadata["language_info"] = {"name": "python"}
    for cell_id, kind, source in cells:
        text = textwrap.dedent(source).strip("\n")
        if kind == "md":
            cell = new_markdown_cell(text)  # type: ignore[no-untyped-call]
        else:
            cell = new_code_cell(text)  # type: ignore[no-untyped-call]
            if kind == "params":
                cell.metadata["tags"] = ["parameters"]
        cell.id = cell_id
        notebook.cells.append(cell)
    ids = [c.id for c in notebook.cells]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate cell ids: {ids}")
    nbformat.validate(notebook)
    return notebook


def render(cells: list[Cell]) -> str:
    text: str = nbformat.writes(build(cells))  # type: ignore[no-untyped-call]
    return text + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for name, cells in NOTEBOOKS.items():
        path = HERE / name
        text = render(cells)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python notebooks/build_notebooks.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
