"""Exported models: a model file (`model.pt`) as ONNX or TorchScript, its metadata inside.

Both formats carry the same `ModelMeta` as the model file (architecture, class table, band
names/mean/std, chip size, resolution, training summary) as the JSON of `meta_to_json`:
ONNX in the model's `metadata_props` under the key `landcover`, TorchScript as the extra file
`landcover.json` (`torch.jit.load(..., _extra_files=...)`), so `landcover predict` reads an
exported file as it reads `model.pt`. An ONNX file also records the SHA-256 of the model
file's bytes it was exported from (`model_digest`, key `landcover_model_sha256`): the
prediction's cache of exported models (`landcover.prediction.backends.onnxcache`) trusts a
cached file only for the model file of that digest.

The graph takes `pixels` (batch, bands, height, width) float32, normalised as
`landcover.data.normalise` does, and returns `logits` (batch, classes, height, width).
Batch, height and width are dynamic. The U-Nets pad their input to a multiple of their stride
with a branch on the input size, which an exporter would freeze at the example's size; the
export therefore wraps them in `_PadToMultiple`, which always pads (by 0 when the size is a
multiple) and crops, as the model itself would: same logits at any size of at least one
stride (8 px for small_unet, 32 px for the ResNet U-Nets).

ONNX uses torch's dynamo exporter (`torch.onnx.export(..., dynamo=True)`, built on
`torch.export` and onnxscript); its operators start at opset 18 (the default here). A higher
`--opset`, up to the newest the installed onnx knows (`supported_opsets`), is converted up by
the version converters of onnxscript and onnx; a lower one is refused, since converting down
fails on the reflect `Pad` (opset 18) that every registered model exports. The file's opset is
checked against the one asked for. TorchScript (deprecated by PyTorch, kept for C++/LibTorch
users) is a trace of the same wrapper.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

import fsspec
import torch
import torch.nn.functional as F
from torch import nn

from landcover.errors import ExportError, LandcoverError, ModelFileError
from landcover.models.modelfile import ModelMeta, load_model_file, meta_from_json, meta_to_json
from landcover.outputs import (
    check_output_file,
    check_output_format,
    require_distinct,
    write_atomic,
    write_bytes_atomic,
)
from tiling.runtime.flags import flag, option
from tiling.runtime.urls import check_storage_options

__all__ = [
    "DEFAULT_OPSET",
    "EXPORT_FORMATS",
    "ExportConfig",
    "ExportFormat",
    "ExportResult",
    "ModelKind",
    "export",
    "export_model",
    "load_torchscript",
    "meta_from_onnx_props",
    "model_digest",
    "model_kind",
    "onnx_model_digest",
    "require_onnx",
    "supported_opsets",
]

ExportFormat = Literal["onnx", "torchscript"]
EXPORT_FORMATS: tuple[str, ...] = get_args(ExportFormat)
DEFAULT_OPSET = 18  # the dynamo exporter's own operators start here
ONNX_METADATA_KEY = "landcover"
ONNX_DIGEST_KEY = "landcover_model_sha256"  # of the model file's bytes it was exported from
TORCHSCRIPT_EXTRA_FILE = "landcover.json"
INPUT_NAME = "pixels"
OUTPUT_NAME = "logits"
DYNAMIC_AXES = ("batch", "height", "width")
ONNX_EXTRA = "pip install onnx onnxruntime onnxscript (dependencies of landcover)"
# What export takes, for the messages about other files
EXPORT_SOURCE = "the model.pt of its training run (RUN_DIR/model.pt from `landcover train`)"

ModelKind = Literal["model", "onnx", "torchscript"]


@dataclass(frozen=True, slots=True)
class ExportConfig:
    """What `export` writes, and the one definition of the options of `landcover export`
    (each field's flag and help: `tiling.runtime.flags`); the format is checked when made."""

    model: str = field(metadata=flag("MODEL"))
    out: str = field(metadata=flag("--out", "Output file, e.g. model.onnx (local path)."))
    format: ExportFormat = field(
        metadata=flag("--format", "onnx (onnxruntime, TensorRT, ...) or torchscript (LibTorch).")
    )
    opset: int = option(
        "--opset",
        DEFAULT_OPSET,
        "ONNX opset of the file, from 18 (the exporter's own) to the newest the installed "
        "onnx knows; above 18 the graph is converted up. --format onnx only.",
    )
    overwrite: bool = False
    storage_options: Mapping[str, Any] = field(
        default_factory=dict, metadata=flag("--storage-options")
    )

    def __post_init__(self) -> None:
        if self.format not in EXPORT_FORMATS:
            raise ExportError(
                f"--format {self.format!r}: choose one of {', '.join(EXPORT_FORMATS)}"
            )


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What `export_model` wrote."""

    out: str
    format: str
    opset: int | None  # the ONNX file's default-domain opset; None for TorchScript
    meta: ModelMeta


class _PadToMultiple(nn.Module):
    """Pads the input (reflect) up to a multiple of `multiple`, runs `model`, crops back."""

    def __init__(self, model: nn.Module, multiple: int) -> None:
        super().__init__()
        self.model = model
        self.multiple = multiple

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[-2], x.shape[-1]
        padded = F.pad(x, (0, (-width) % self.multiple, 0, (-height) % self.multiple), "reflect")
        logits: torch.Tensor = self.model(padded)
        return logits[..., :height, :width]


def require_onnx(module: str) -> Any:
    """Import an optional ONNX library, or say which extra installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ExportError(f"{module} is not installed; {ONNX_EXTRA}") from None


def require_onnx_installed(*modules: str) -> None:
    """Refuse, as `require_onnx` does, where an optional ONNX library is not installed,
    without importing it: onnxscript's import (sympy among it) is left to the export that
    needs it, so a prediction from a cached export never pays for it."""
    import importlib.util

    for module in modules:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):  # a parent package missing, or set to None
            found = None
        if found is None:
            raise ExportError(f"{module} is not installed; {ONNX_EXTRA}")


def supported_opsets() -> range:
    """The ONNX opsets `export_model` writes: from `DEFAULT_OPSET`, where the exporter's own
    operators start, to the newest the installed onnx knows (its version converter's limit)."""
    onnx = require_onnx("onnx")
    return range(DEFAULT_OPSET, int(onnx.defs.onnx_opset_version()) + 1)


def _check_opset(opset: int) -> None:
    """Refuse an `--opset` outside `supported_opsets`, naming the range."""
    opsets = supported_opsets()
    if opset not in opsets:
        raise ExportError(
            f"--opset {opset}: the installed exporter writes ONNX opsets {opsets.start} to "
            f"{opsets.stop - 1}; choose one of them (default {DEFAULT_OPSET})"
        )


def export_model(
    model_url: str,
    out: str | os.PathLike[str],
    *,
    format: str,
    opset: int = DEFAULT_OPSET,
    overwrite: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> ExportResult:
    """Write the model of `model_url` (a `model.pt`) to `out` as ONNX or TorchScript, with its
    metadata inside; refuses an existing `out` unless `overwrite`, writes atomically (`export`
    of the `ExportConfig` of these values)."""
    config = ExportConfig(
        model=model_url,
        out=os.fspath(out),
        format=cast(ExportFormat, format),  # checked by the config
        opset=opset,
        overwrite=overwrite,
        storage_options=storage_options or {},
    )
    return export(config)


def export(config: ExportConfig) -> ExportResult:
    """Write `config.model` (a `model.pt`) to `config.out` in `config.format`, its metadata
    inside; refuses an existing output unless `config.overwrite`, writes atomically."""
    model_url, out, format, opset = config.model, config.out, config.format, config.opset
    overwrite, storage_options = config.overwrite, config.storage_options
    check_storage_options([model_url, os.fspath(out)], storage_options)
    if format == "onnx":
        _check_opset(opset)
    kind = model_kind(model_url, storage_options=storage_options)
    if kind != "model":
        name = "ONNX" if kind == "onnx" else "TorchScript"
        raise ExportError(
            f"{model_url} is an exported {name} file; export takes a landcover model file: "
            f"give {EXPORT_SOURCE}"
        )
    require_distinct([("--out", os.fspath(out))], inputs=[("model", model_url)])
    name_like = "model.onnx" if format == "onnx" else "model.torchscript"
    suffixes = (".onnx",) if format == "onnx" else (".torchscript", ".pt", ".ts")
    check_output_format(os.fspath(out), option="--out", expected=suffixes, example=name_like)
    check_output_file(out, option="--out", overwrite=overwrite, example=name_like)
    if format == "onnx":
        for module in ("onnx", "onnxscript"):
            require_onnx(module)
    # Before the model loads: a file replaced meanwhile gives a digest that its cache entry
    # does not match (`landcover.prediction.backends.onnxcache` checks), never a wrong match.
    digest = model_digest(model_url, storage_options=storage_options) if format == "onnx" else ""
    model, meta = load_model_file(model_url, storage_options=storage_options)
    graph = _exportable(model)
    # Batch 2: torch.export specialises a dimension whose example size is 0 or 1.
    example = torch.zeros(2, meta.in_channels, meta.chip_size, meta.chip_size)
    meta_json = json.dumps(meta_to_json(meta))
    props = {ONNX_METADATA_KEY: meta_json, ONNX_DIGEST_KEY: digest}
    if format == "torchscript":
        buffer = io.BytesIO()  # saved from memory, its archive is not named after a temp file
        with _quiet_jit():
            traced = torch.jit.trace(graph, example)  # type: ignore[no-untyped-call]
            torch.jit.save(traced, buffer, _extra_files={TORCHSCRIPT_EXTRA_FILE: meta_json})
        write_bytes_atomic(out, buffer.getvalue(), overwrite=overwrite)
        return ExportResult(os.fspath(out), format, None, meta)
    actual: list[int] = []
    try:
        write_atomic(
            out,
            lambda tmp: actual.append(_write_onnx(graph, example, tmp, opset, props)),
            overwrite=overwrite,
        )
    except LandcoverError:
        raise
    except (RuntimeError, ValueError, TypeError) as exc:  # the exporter's own errors
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ExportError(
            f"{model_url}: the ONNX exporter failed on {meta.architecture} ({first}); "
            "try --format torchscript"
        ) from exc
    return ExportResult(os.fspath(out), format, actual[0], meta)


def _exportable(model: nn.Module) -> nn.Module:
    multiple = getattr(model, "size_multiple", 1)
    wrapped = _PadToMultiple(model, int(multiple)) if int(multiple) > 1 else model
    return wrapped.eval()


def _write_onnx(
    graph: nn.Module, example: torch.Tensor, path: str, opset: int, props: Mapping[str, str]
) -> int:
    """Export `graph` to `path`, add the metadata `props`; returns the file's opset, which is
    `opset` (`ExportError` when the version converter could not convert the graph)."""
    onnx = require_onnx("onnx")
    multiple = int(getattr(graph, "multiple", 1))
    batch = torch.export.Dim("batch")
    # Reflect padding needs the input larger than the pad: at least one stride.
    height = torch.export.Dim("height", min=max(multiple, 2))
    width = torch.export.Dim("width", min=max(multiple, 2))
    # The exporter prints its steps and warns about opset conversion: we log our own line.
    with _quiet_jit(), contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(
            graph,
            (example,),
            path,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_shapes={"x": {0: batch, 2: height, 3: width}},
            opset_version=opset,
            dynamo=True,
            external_data=False,  # one file: the weights inside, not in a .data file beside it
            verbose=False,
        )
    proto = onnx.load(path)
    onnx.helper.set_model_props(proto, dict(props))
    onnx.save(proto, path)
    written = next(int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    if written != opset:  # the converters log their failure and keep the exporter's opset
        raise ExportError(
            f"--opset {opset}: the ONNX version converter could not convert the graph (it "
            f"stays at opset {written}); choose another --opset, e.g. {DEFAULT_OPSET}"
        )
    return written


@contextlib.contextmanager
def _quiet_jit() -> Iterator[None]:
    # torch.jit/onnx deprecation notes, tracer warnings about the U-Nets' size branch (always
    # false behind _PadToMultiple) and the ONNX optimiser's log of its passes (INFO, dozens of
    # lines) say nothing a user can act on; nor do the version converters' warnings, whose
    # outcome `_write_onnx` checks.
    quiet_levels = {
        "onnx_ir": logging.WARNING,
        "onnxscript": logging.WARNING,
        "onnxscript.version_converter": logging.ERROR,
        "torch.onnx": logging.WARNING,
    }
    loggers = [logging.getLogger(name) for name in quiet_levels]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # type: ignore[attr-defined]
        warnings.simplefilter("ignore", UserWarning)
        for lg in loggers:
            lg.setLevel(quiet_levels[lg.name])
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels, strict=True):
                lg.setLevel(level)


def model_digest(url: str, *, storage_options: Mapping[str, Any] | None = None) -> str:
    """The SHA-256 (hex) of a model file's bytes, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    try:
        with fsspec.open(url, "rb", **dict(storage_options or {})) as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except FileNotFoundError:
        raise ModelFileError(f"{url}: model file not found") from None
    except IsADirectoryError:
        raise ModelFileError(
            f"{url} is not a landcover model file (model.pt from `landcover train`); it is a "
            "directory"
        ) from None
    return digest.hexdigest()


def onnx_model_digest(props: Mapping[str, str]) -> str | None:
    """The digest of the model file an ONNX file was exported from, from its
    `metadata_props` (None for a file exported before digests were recorded)."""
    return props.get(ONNX_DIGEST_KEY) or None


def model_kind(url: str, *, storage_options: Mapping[str, Any] | None = None) -> ModelKind:
    """What a model file is: `torchscript` (a zip with TorchScript code), `onnx` (named
    *.onnx: ONNX protobufs have no magic number) or `model` (anything else, left to
    `read_model_file` to accept or refuse)."""
    if url.lower().endswith(".onnx"):
        return "onnx"
    try:
        with fsspec.open(url, "rb", **dict(storage_options or {})) as f:
            if f.read(4) != b"PK\x03\x04":
                return "model"
            f.seek(0)
            names = zipfile.ZipFile(f).namelist()
    except (OSError, zipfile.BadZipFile):
        return "model"
    return "torchscript" if any(n.endswith("/constants.pkl") for n in names) else "model"


def load_torchscript(
    url: str,
    *,
    device: str | torch.device = "cpu",
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[nn.Module, ModelMeta]:
    """A TorchScript file from `landcover export` and the metadata it carries."""
    extra = {TORCHSCRIPT_EXTRA_FILE: ""}
    try:
        with fsspec.open(url, "rb", **dict(storage_options or {})) as f, _quiet_jit():
            module = torch.jit.load(  # type: ignore[no-untyped-call]
                io.BytesIO(f.read()), map_location=device, _extra_files=extra
            )
    except (RuntimeError, OSError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise ModelFileError(f"{url}: cannot load the TorchScript file ({reason})") from None
    payload = _metadata_json(
        extra[TORCHSCRIPT_EXTRA_FILE], where=url, holder=f"extra file {TORCHSCRIPT_EXTRA_FILE}"
    )
    meta = meta_from_json(payload, where=url, not_ours=_not_exported(url, "TorchScript"))
    return module.eval(), meta


def meta_from_onnx_props(props: Mapping[str, str], where: str) -> ModelMeta:
    """The metadata of an ONNX file from `landcover export`, from its `metadata_props`."""
    holder = f"metadata_props {ONNX_METADATA_KEY!r}"
    payload = _metadata_json(props.get(ONNX_METADATA_KEY, ""), where=where, holder=holder)
    return meta_from_json(payload, where=where, not_ours=_not_exported(where, "ONNX"))


def _metadata_json(text: str | bytes, *, where: str, holder: str) -> object:
    """The parsed landcover metadata of an exported file, None when it has none;
    `ModelFileError` naming the file and `holder` (where in the file the metadata sits) when
    that text is not JSON."""
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError, or UnicodeDecodeError for bytes
        reason = (
            f"{exc.msg} at character {exc.pos}" if isinstance(exc, json.JSONDecodeError) else exc
        )
        raise ModelFileError(
            f"{where}: its landcover metadata ({holder}) is corrupt, not JSON ({reason}); "
            f"export it again from {EXPORT_SOURCE}"
        ) from None


def _not_exported(where: str, kind: str) -> str:
    return (
        f"{where}: {kind} file without landcover metadata; export it with "
        "`landcover export model.pt --format ...`"
    )
