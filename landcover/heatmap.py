"""A class-by-class matrix drawn as a heat map PNG: the confusion matrix of `evaluate` and the
transitions of `change`.

Each cell is coloured by its share of its row (0 to 1) and labelled with its own text (a
count, an area); class names are plain text, never mathtext. matplotlib is imported only
when a matrix is drawn, and the figure is drawn without pyplot, so no backend is switched
(a notebook keeps its inline one).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from landcover.markup import plain_figures, plot_text

__all__ = ["matrix_png"]

# Inches per class across and down: room for a cell's text and a slanted class name.
_CELL_IN = (1.1, 1.0)


def matrix_png(
    share: npt.NDArray[np.float64],
    cells: Sequence[Sequence[str]],
    names: Sequence[object],
    *,
    axes: tuple[str, str],
    colour: tuple[str, str],
    title: str,
    margin_in: tuple[float, float],
) -> bytes:
    """The k x k matrix `share` (row shares, 0 to 1) as a PNG heat map, cell (i, j) labelled
    `cells[i][j]`, rows and columns named `names`; `axes` = (column label, row label),
    `colour` = (matplotlib colour map, colour bar label), `margin_in` the figure's size in
    inches beside the cells (across, down)."""
    from matplotlib.figure import Figure

    labels = [plot_text(n) for n in names]
    k = len(labels)
    with plain_figures():
        fig = Figure(
            figsize=(margin_in[0] + _CELL_IN[0] * k, margin_in[1] + _CELL_IN[1] * k), dpi=100
        )
        ax = fig.add_subplot()
        image = ax.imshow(share, cmap=colour[0], vmin=0.0, vmax=1.0)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label=colour[1])
        ax.set_xticks(range(k), labels, rotation=35, ha="right")
        ax.set_yticks(range(k), labels)
        ax.set_xlabel(axes[0])
        ax.set_ylabel(axes[1])
        ax.set_title(title, fontsize=10)
        for i in range(k):
            for j in range(k):
                text_colour = "white" if share[i, j] > 0.5 else "black"
                ax.text(j, i, cells[i][j], ha="center", va="center", color=text_colour,
                        fontsize=8)  # fmt: skip
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()
