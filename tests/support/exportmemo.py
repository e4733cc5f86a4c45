"""One ONNX export per distinct model and options in a test session.

torch's dynamo exporter takes tens of seconds of CPU for even small_unet (symbolic shapes
traced twice), and many tests export the same model file: a module's trained model into each
test's own cache, a seeded random model in several files. `ExportMemo` wraps
`landcover.models.export._write_onnx`, the one call that runs the exporter: the first export
of a (model file digest, metadata, opset, example shape, graph class) runs it and keeps a copy
of the file; a later export of the same key copies that file to its temp path instead. The
code around it, checks, atomic write, the cache's digests and locks, runs as in a user's
process, and each distinct model is still exported for real once.

Not memoised: a failed export (nothing is kept), and any export while a test has replaced
`torch.onnx.export` (its fake file must be what that test sees). The memo lives in one
directory per test session, shared by the xdist workers.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

WriteOnnx = Callable[[torch.nn.Module, torch.Tensor, str, int, Mapping[str, str]], int]

__all__ = ["ExportMemo", "memo_key"]


def memo_key(
    graph: torch.nn.Module, example: torch.Tensor, opset: int, props: Mapping[str, str]
) -> str:
    """What decides the exporter's output: the model file (its digest and metadata are in
    `props`), the opset, the example's shape and dtype, the wrapper class, and the versions of
    torch and onnxscript."""
    from importlib.metadata import version

    parts = [
        sorted(props.items()),
        opset,
        list(example.shape),
        str(example.dtype),
        type(graph).__qualname__,
        version("torch"),
        version("onnxscript"),
    ]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


class ExportMemo:
    """`write_onnx` (the exporter call) run once per `memo_key`; later calls copy its file."""

    def __init__(self, root: Path, write_onnx: WriteOnnx, exporter: Any) -> None:
        self.root = root
        self.write_onnx = write_onnx
        self.exporter = exporter  # torch.onnx.export as it was: a test's fake is never kept
        self.hits = 0
        root.mkdir(parents=True, exist_ok=True)

    def __call__(
        self,
        graph: torch.nn.Module,
        example: torch.Tensor,
        path: str,
        opset: int,
        props: Mapping[str, str],
    ) -> int:
        if torch.onnx.export is not self.exporter:
            return self.write_onnx(graph, example, path, opset, props)
        kept = self.root / f"{memo_key(graph, example, opset, props)}.onnx"
        if kept.is_file():
            shutil.copyfile(kept, path)
            self.hits += 1
            return opset  # an export kept here wrote `opset` (a converter failure raises)
        written = self.write_onnx(graph, example, path, opset, props)
        partial = kept.with_name(f"{kept.name}.{os.getpid()}.tmp")
        shutil.copyfile(path, partial)
        os.replace(partial, kept)
        return written
