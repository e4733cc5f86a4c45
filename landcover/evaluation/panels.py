"""Pictures of an evaluation: a panel per evaluated scene (imagery | truth | prediction |
disagreement), the per-class table as a picture, and an HTML report holding them with the
scores.

A scene is a truth raster's footprint on the prediction. Its pictures are read onto a small
display grid (at most `PANEL_PX` on the longer side): the prediction from its overviews, the
imagery it was predicted from (recorded by `predict`) from theirs, the truth warped with
nearest neighbour and remapped as the scores remap it (`landcover.view.display`,
`tiling.sources.reader`). Drawn with matplotlib, as the confusion matrix is; scene and class names
are plain text in the pictures and escaped in the page (`landcover.markup`).
"""

from __future__ import annotations

import base64
import io
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from rasterio.windows import Window
from shapely.geometry import box

from landcover.evaluation.compare import _truth_class_map, prediction_on_grid
from landcover.evaluation.config import EvaluateConfig
from landcover.evaluation.scores import Evaluation
from landcover.markup import html_text, plain_figures, plot_text
from landcover.prediction.outgrid import footprint_in_crs
from landcover.view.display import DisplayGrid, class_rgba, locate, read_classes, read_imagery
from landcover.view.mapfile import open_map
from tiling.runtime.urls import is_local
from tiling.sources.classes import ClassMap
from tiling.sources.rasters import open_label
from tiling.sources.reader import RasterReader

__all__ = [
    "AGREE_RGB",
    "DISAGREE_RGB",
    "MAX_PANELS",
    "PANEL_PX",
    "ScenePanel",
    "classes_png",
    "panel_png",
    "report_html",
    "scene_panels",
]

logger = logging.getLogger(__name__)

PANEL_PX = 400
MAX_PANELS = 16  # a state's evaluation has thousands of truth tiles: the first ones are drawn
AGREE_RGB = (224, 224, 224)
DISAGREE_RGB = (215, 25, 28)


@dataclass(frozen=True, slots=True)
class ScenePanel:
    """One scene's pictures on one display grid: class codes of truth and prediction, and
    the imagery as RGBA (None: no imagery recorded or readable)."""

    name: str
    imagery: npt.NDArray[np.uint8] | None
    truth: npt.NDArray[np.uint8]
    predicted: npt.NDArray[np.uint8]

    def disagreement(self) -> npt.NDArray[np.uint8]:
        """RGB: grey where truth and prediction agree, red where they differ, white where
        either has no class."""
        rgb = np.full((*self.truth.shape, 3), 255, dtype=np.uint8)
        both = (self.truth > 0) & (self.predicted > 0)
        rgb[both & (self.truth == self.predicted)] = AGREE_RGB
        rgb[both & (self.truth != self.predicted)] = DISAGREE_RGB
        return rgb


def scene_panels(
    config: EvaluateConfig, evaluation: Evaluation, *, max_panels: int = MAX_PANELS
) -> list[ScenePanel]:
    """The panels of the first `max_panels` scenes of `evaluation` (one per truth raster that
    overlaps the prediction); none for a prediction that is not a local file."""
    if not is_local(config.prediction):
        logger.info("no panels for %s: pictures are drawn for local maps", config.prediction)
        return []
    prediction = open_map(config.prediction)
    truth_map = _truth_class_map(config.class_map, evaluation.class_map)
    parts = locate(prediction.parts, prediction.crs, what="map file")
    images = locate(prediction.sources, prediction.crs)
    outline = box(*prediction.bounds)
    panels = []
    reader = RasterReader(storage_options=config.storage_options)
    try:
        for path in evaluation.truth[:max_panels]:
            label = open_label(path, storage_options=config.storage_options)
            scene = footprint_in_crs(label, prediction.crs).intersection(outline)
            if scene.is_empty or scene.area == 0:
                continue
            pixel = prediction.transform.a
            native = math.ceil(max(*_size(scene.bounds)) / pixel)
            grid = DisplayGrid.fitting(
                prediction.crs, scene.bounds, long_side_px=min(PANEL_PX, max(native, 1))
            )
            on_grid = prediction_on_grid(
                config.prediction, grid, block_shape=(grid.height, grid.width)
            )
            truth = reader.read_labels(
                on_grid, Window(0, 0, grid.width, grid.height), [label], truth_map
            )
            panels.append(
                ScenePanel(
                    name=Path(path).name,
                    imagery=read_imagery(images, grid) if images else None,
                    truth=truth,
                    predicted=read_classes(parts, grid),
                )
            )
    finally:
        reader.close()
    if len(evaluation.truth) > max_panels:
        logger.info("panels of the first %d of %d scenes", max_panels, len(evaluation.truth))
    return panels


def _size(bounds: tuple[float, float, float, float]) -> tuple[float, float]:
    return bounds[2] - bounds[0], bounds[3] - bounds[1]


def panel_png(panel: ScenePanel, class_map: ClassMap) -> bytes:
    """The panel as PNG: imagery | truth | prediction | disagreement, a legend beneath."""
    with plain_figures():
        return _draw_panel(panel, class_map)


def _draw_panel(panel: ScenePanel, class_map: ClassMap) -> bytes:
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    height, width = panel.truth.shape
    aspect = height / max(width, 1)
    fig = Figure(figsize=(12.0, 3.0 * aspect + 1.1), dpi=100)
    axes = fig.subplots(1, 4)
    pictures = [
        ("imagery", panel.imagery),
        ("truth", class_rgba(panel.truth, class_map)),
        ("prediction", class_rgba(panel.predicted, class_map)),
        ("disagreement", panel.disagreement()),
    ]
    for ax, (title, picture) in zip(axes, pictures, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
        if picture is None:
            ax.text(0.5, 0.5, "no imagery recorded", ha="center", va="center", fontsize=9)
            ax.set_facecolor("#f0f0f0")
            ax.set_aspect(aspect)
            continue
        ax.imshow(picture, interpolation="nearest")
    handles = [
        Patch(facecolor=_unit(c.color), edgecolor="#555555", label=plot_text(c.name))
        for c in class_map.classes
        if c.code
    ]
    handles += [
        Patch(facecolor=_unit(AGREE_RGB), edgecolor="#555555", label="agree"),
        Patch(facecolor=_unit(DISAGREE_RGB), edgecolor="#555555", label="disagree"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, fontsize=8)
    fig.suptitle(plot_text(panel.name), fontsize=10)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.85, bottom=0.12, wspace=0.04)
    return _png(fig)


def classes_png(evaluation: Evaluation) -> bytes:
    """The per-class table (IoU, precision, recall, F1, pixels) as PNG."""
    with plain_figures():
        return _draw_classes(evaluation)


def _draw_classes(evaluation: Evaluation) -> bytes:
    from matplotlib.figure import Figure

    rows = [
        [
            plot_text(c.name),
            *(_fmt(v) for v in (c.iou, c.precision, c.recall, c.f1)),
            f"{c.truth_pixels:,}",
            f"{c.predicted_pixels:,}",
        ]
        for c in evaluation.classes
    ]
    columns = ["class", "IoU", "precision", "recall", "F1", "truth px", "predicted px"]
    fig = Figure(figsize=(8.0, 0.9 + 0.3 * len(rows)), dpi=100)
    ax = fig.add_subplot()
    ax.set_axis_off()
    table = ax.table(cellText=rows, colLabels=columns, loc="center", cellLoc="right")
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    for row, c in enumerate(evaluation.classes, start=1):
        table[row, 0].set_text_props(ha="left")
        table[row, 0].set_facecolor(_unit(_light(evaluation.class_map, c.code)))
    ax.set_title(
        f"accuracy {evaluation.pixel_accuracy:.3f}, mIoU {evaluation.mean_iou:.3f}", fontsize=10
    )
    return _png(fig)


def report_html(
    evaluation: Evaluation,
    *,
    confusion: bytes,
    classes: bytes,
    panels: Sequence[tuple[str, bytes]],
) -> str:
    """A self-contained HTML report: the scores, the per-class table (HTML, with the class
    colours), the confusion matrix and the panels (`(caption, PNG)`), pictures inline."""
    rows = "".join(
        f'<tr data-code="{c.code}"><td><span class="swatch" style="background:'
        f'{_hex(evaluation.class_map, c.code)}"></span></td><td class="name">'
        f"{html_text(c.name)}</td><td>{_fmt(c.iou)}</td><td>{_fmt(c.precision)}</td>"
        f"<td>{_fmt(c.recall)}</td><td>{_fmt(c.f1)}</td><td>{c.truth_pixels:,}</td>"
        f"<td>{c.predicted_pixels:,}</td></tr>"
        for c in evaluation.classes
    )
    figures = "".join(
        f'<figure class="panel"><img alt="{html_text(caption)}" src="{_uri(png)}">'
        f"<figcaption>{html_text(caption)}</figcaption></figure>"
        for caption, png in panels
    )
    truth = ", ".join(Path(t).name for t in evaluation.truth)
    return _REPORT.format(
        title=html_text(f"Evaluation of {Path(evaluation.prediction).name}"),
        truth=html_text(f"{truth} (remapped with {evaluation.truth_class_map})"),
        pixels=f"{evaluation.pixels:,}",
        accuracy=_fmt(evaluation.pixel_accuracy),
        miou=_fmt(evaluation.mean_iou),
        fwiou=_fmt(evaluation.frequency_weighted_iou),
        rows=rows,
        confusion=_uri(confusion),
        classes=_uri(classes),
        panels=figures or "<p>No scene to show.</p>",
    )


def _png(fig: object) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", facecolor="white")  # type: ignore[attr-defined]
    return buffer.getvalue()


def _uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _unit(rgb: Sequence[int]) -> tuple[float, float, float]:
    return (rgb[0] / 255, rgb[1] / 255, rgb[2] / 255)


def _light(class_map: ClassMap, code: int) -> tuple[int, int, int]:
    """The class colour mixed with white, as a table cell's background."""
    r, g, b = class_map.classes[code].color
    return ((r + 3 * 255) // 4, (g + 3 * 255) // 4, (b + 3 * 255) // 4)


def _hex(class_map: ClassMap, code: int) -> str:
    return "#{:02x}{:02x}{:02x}".format(*class_map.classes[code].color)


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


_REPORT = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; color: #222; margin: 16px 24px; }}
table {{ border-collapse: collapse; }}
td, th {{ padding: 3px 8px; text-align: right; border-bottom: 1px solid #ddd; }}
td.name, th.name {{ text-align: left; }}
.swatch {{ display: inline-block; width: 14px; height: 14px; border: 1px solid #555; }}
figure {{ margin: 12px 0; }}
figure img {{ max-width: 100%; }}
</style>
</head>
<body>
<h1>{title}</h1>
<p>Truth: {truth}</p>
<p id="scores">Pixels compared: {pixels} · pixel accuracy {accuracy} · mean IoU {miou} ·
frequency-weighted IoU {fwiou}</p>
<h2>Classes</h2>
<table id="classes">
<thead><tr><th></th><th class="name">class</th><th>IoU</th><th>precision</th><th>recall</th>
<th>F1</th><th>truth px</th><th>predicted px</th></tr></thead>
<tbody>{rows}</tbody>
</table>
<h2>Scenes</h2>
{panels}
<h2>Confusion matrix</h2>
<figure><img alt="confusion matrix" src="{confusion}"></figure>
<h2>Class table</h2>
<figure><img alt="per-class table" src="{classes}"></figure>
</body>
</html>
"""
