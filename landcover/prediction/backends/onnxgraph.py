"""The one check of an ONNX graph against its landcover metadata: the bands it takes and the
classes it gives."""

from __future__ import annotations

from typing import Any

from landcover.errors import ModelFileError
from landcover.models.export import EXPORT_SOURCE
from landcover.models.modelfile import ModelMeta

__all__ = ["check_graph_matches_meta"]


def check_graph_matches_meta(session: Any, meta: ModelMeta, where: str) -> None:
    """Refuse an ONNX graph that does not take and give what its metadata says: one input and
    one output of rank 4 (batch, channels, height, width), `meta.in_channels` bands in and
    `meta.num_classes` logits out, where the graph names those sizes (a dynamic one passes)."""
    inputs, outputs = session.get_inputs(), session.get_outputs()
    if len(inputs) != 1 or len(outputs) != 1:
        raise ModelFileError(
            f"{where}: the ONNX graph has {len(inputs)} inputs and {len(outputs)} outputs; a "
            f"landcover model has one of each (export it again from {EXPORT_SOURCE})"
        )
    for value, role, expected, what in (
        (inputs[0], "input", meta.in_channels, f"bands ({', '.join(meta.band_names)})"),
        (outputs[0], "output", meta.num_classes, f"classes ({meta.class_map.name})"),
    ):
        shape = list(value.shape or [])
        if not shape:  # a graph without shape information: nothing to compare
            continue
        channels = shape[1] if len(shape) == 4 else None
        if len(shape) != 4 or (isinstance(channels, int) and channels != expected):
            raise ModelFileError(
                f"{where}: the ONNX graph's {role} {value.name!r} has shape {shape}, but its "
                f"landcover metadata says (batch, {expected}, height, width) for {expected} "
                f"{what}; the graph and the metadata are of different models: export it "
                f"again from {EXPORT_SOURCE}"
            )
