"""`TrainConfig`: every option of a training run, identical on every rank, and the one
definition of those options.

Each field declares its command-line flag and help (`_option`); its type gives the kind of value
and, for a `Literal`, the choices. From that one table come the click options of `landcover
train` and of the worker (`train_options`), the checks (`TrainConfig.__post_init__`), the argv
that gives a worker this configuration (`to_argv`) and the parse of such an argv (`from_argv`,
with the worker's own options, so that a launcher refuses what every worker would).

The storage options never go into an argv: a launcher gives them to its workers through their
environment (`landcover.options.storage_options_env`), where `--storage-options` falls back
to reading them. Torch-free, so the CLI and the launchers can build and check a configuration
without paying for importing torch.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal, TypeVar, get_args, get_origin

import click

from cluster.redact import Redactor
from landcover.comm.spec import parse_compression
from landcover.errors import TrainingError
from landcover.models.weightsource import check_pretrained_value
from landcover.options import storage_options_option

Optimizer = Literal["adamw", "sgd"]
Loss = Literal["ce", "ce+dice"]
ClassWeights = Literal["auto", "none"]
Device = Literal["auto", "cpu", "cuda"]
LrScaling = Literal["linear", "sqrt", "none"]
TRACKING_BACKENDS = ("tensorboard", "mlflow")
DEFAULT_LR: Mapping[str, float] = {"adamw": 2e-3, "sgd": 0.02}
WORKER_PROG = "python -m landcover.training"

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Flag:
    """How a TrainConfig field is written on a command line: `--name VALUE`, a boolean flag
    (`--name`, and `off` for the form that sets it False), or the positional STORE."""

    name: str
    help: str | None = None
    off: str | None = None

    @property
    def positional(self) -> bool:
        return not self.name.startswith("-")


def _flag(name: str, help: str | None = None, *, off: str | None = None) -> dict[str, Flag]:
    """A field's metadata: how it is written on a command line."""
    return {"flag": Flag(name, help, off)}


def _option(flag: str, default: T, help: str | None = None, *, off: str | None = None) -> T:
    """A field with a default, written on a command line as `flag` (see `Flag`)."""
    return field(default=default, metadata=_flag(flag, help, off=off))


_BMUF = "BMUF: "


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Everything a training run needs; built by the CLI, identical on every rank."""

    store_url: str = field(metadata=_flag("STORE"))
    out_dir: str = field(metadata=_flag("--out", "Run directory (RUN_DIR)."))
    model: str = _option(
        "--model",
        "small_unet",
        "Model registry name, or smp:ARCH:ENCODER (e.g. smp:Unet:resnet34); `landcover models` "
        "lists them.",
    )
    pretrained: str | None = _option(
        "--pretrained",
        None,
        "Start the encoder from weights: imagenet (from the local torch hub / Hugging Face "
        "cache) or PATH of an encoder state dict (.pth, .safetensors).",
    )
    epochs: int = _option("--epochs", 10)
    batch_size: int = _option("--batch-size", 16, "Chips per step per worker.")
    lr: float | None = _option(
        "--lr",
        None,  # DEFAULT_LR of the optimizer
        "Base learning rate (default 2e-3 adamw, 0.02 sgd), scaled by the world size per "
        "--lr-scaling, linear warm-up then cosine decay.",
    )
    lr_scaling: LrScaling = _option(
        "--lr-scaling",
        "linear",
        "How the base lr grows with the number of workers (not with BMUF).",
    )
    warmup_epochs: float = _option("--warmup-epochs", 1.0)
    weight_decay: float = _option("--weight-decay", 1e-4)
    optimizer: Optimizer = _option("--optimizer", "adamw")
    loss: Loss = _option("--loss", "ce", "Cross-entropy ignoring nodata, optionally + Dice.")
    class_weights: ClassWeights = _option(
        "--class-weights", "auto", "auto: median-frequency weights from the store's class counts."
    )
    augment: bool = _option(
        "--augment", True, "Random flips and 90-degree rotations.", off="--no-augment"
    )
    brightness_jitter: float = _option(
        "--brightness-jitter",
        0.2,
        "With --augment, scale each chip's bands by a random gain in [1-J, 1+J] and each band "
        "by one in [1-J/2, 1+J/2], so that the model does not learn one tile's brightness "
        "(0: off; the default was chosen by benchmarks/bench_quality.py).",
    )
    seed: int = _option("--seed", 0)
    patience: int | None = _option(
        "--patience", None, "Stop after this many epochs without a better val mIoU."
    )
    resume: bool = _option(
        "--resume", False, "Continue from RUN_DIR/checkpoints/last.pt (fresh start if none)."
    )
    overwrite: bool = _option("--overwrite", False, "Replace existing output.")
    device: Device = _option("--device", "auto")
    amp: bool | None = _option(
        "--amp", None, "bf16 autocast (default: on for CUDA, off on CPU).", off="--no-amp"
    )
    threads: int | None = _option(
        "--threads", None, "Torch threads per worker (default: cores / local workers)."
    )
    # never in an argv: workers read them from their environment (see the module docstring)
    storage_options: Mapping[str, Any] = field(
        default_factory=dict, metadata=_flag("--storage-options")
    )
    compression: str = _option(
        "--compression",
        "none",
        "DDP gradient compression: none, fp16, bf16, powersgd[:RANK], onebit.",
    )
    block_momentum: bool = _option(
        "--block-momentum",
        False,
        "BMUF: local steps, then a block-level model average with momentum.",
    )
    block_size: int = _option("--block-size", 8, _BMUF + "local steps per block.")
    block_momentum_value: float | None = _option(
        "--block-momentum-value", None, "BMUF block momentum (default 1 - 1/workers)."
    )
    block_lr: float = _option("--block-lr", 1.0, "BMUF block learning rate.")
    nesterov: bool = _option(
        "--nesterov", True, _BMUF + "Nesterov-style block momentum.", off="--no-nesterov"
    )
    reset_local_momentum: bool = _option(
        "--reset-local-momentum",
        True,
        _BMUF + "zero each worker's optimizer momentum after every block end.",
        off="--keep-local-momentum",
    )
    allow_incomplete: bool = _option(
        "--allow-incomplete",
        False,
        "Train on a store whose tiling was interrupted (default: refuse it).",
    )
    sync_bn: bool = _option(
        "--sync-bn",
        False,
        "SyncBatchNorm: normalise with the whole step's batch statistics (CUDA only; without "
        "it, BatchNorm statistics are averaged over the workers after every epoch).",
    )
    tracking: str = _option(
        "--tracking",
        "auto",
        "Experiment tracking besides metrics.jsonl: a comma list of tensorboard, mlflow; none; "
        "auto: tensorboard, and mlflow too when MLFLOW_TRACKING_URI is set.",
    )
    log_every: int = _option(
        "--log-every",
        50,
        "Without a terminal, also log a progress line every N steps (0: epoch lines only).",
    )

    def __post_init__(self) -> None:
        checks: list[tuple[bool, str]] = [
            # inf passes every bound below (and nan every `not <`): a NaN loss from step one
            *(
                (
                    not isinstance(getattr(self, o.name), float)
                    or math.isfinite(getattr(self, o.name)),
                    f"{o.flag.name} {getattr(self, o.name)} must be a finite number",
                )
                for o in OPTIONS
                if o.kind is float
            ),
            (self.epochs >= 1, f"--epochs {self.epochs} must be >= 1"),
            (self.batch_size >= 1, f"--batch-size {self.batch_size} must be >= 1"),
            (self.lr is None or self.lr > 0, f"--lr {self.lr} must be > 0"),
            (self.warmup_epochs >= 0, f"--warmup-epochs {self.warmup_epochs} must be >= 0"),
            (self.weight_decay >= 0, f"--weight-decay {self.weight_decay} must be >= 0"),
            (
                0 <= self.brightness_jitter < 1,
                f"--brightness-jitter {self.brightness_jitter} must be in [0, 1)",
            ),
            (
                self.patience is None or self.patience >= 1,
                f"--patience {self.patience} must be >= 1",
            ),
            (self.threads is None or self.threads >= 1, f"--threads {self.threads} must be >= 1"),
            (self.block_size >= 1, f"--block-size {self.block_size} must be >= 1"),
            (self.block_lr > 0, f"--block-lr {self.block_lr} must be > 0"),
            (self.log_every >= 0, f"--log-every {self.log_every} must be >= 0 (0: off)"),
            (
                self.block_momentum_value is None or 0 <= self.block_momentum_value < 1,
                f"--block-momentum-value {self.block_momentum_value} must be in [0, 1)",
            ),
            *(
                (
                    getattr(self, o.name) in o.choices
                    or (o.optional and getattr(self, o.name) is None),
                    f"{o.flag.name} {getattr(self, o.name)!r}: use one of {o.choices}",
                )
                for o in OPTIONS
                if o.choices is not None
            ),
            (
                not (self.resume and self.overwrite),
                "--resume and --overwrite exclude each other; pick one",
            ),
            (
                not (self.block_momentum and self.compression != "none"),
                f"--compression {self.compression} compresses DDP gradients but --block-momentum "
                "averages models instead; use one of them",
            ),
            (
                not (self.block_momentum and self.sync_bn),
                "--sync-bn all-reduces BatchNorm statistics in every step, which "
                "--block-momentum's local steps avoid (BMUF averages them at block ends); "
                "use one of them",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise TrainingError(message)
        parse_compression(self.compression)  # a bad value fails here, not after the load
        check_pretrained_value(self.pretrained)
        parse_tracking(self.tracking)

    @property
    def base_lr(self) -> float:
        return self.lr if self.lr is not None else DEFAULT_LR[self.optimizer]

    def to_json(self) -> dict[str, Any]:
        """Plain values for run.json and checkpoints; secrets in storage options redacted
        (`cluster.redact`: secret-named keys, and secret-looking text such as SAS signatures)."""
        values = {f.name: _plain(getattr(self, f.name)) for f in fields(self)}
        values["storage_options"] = Redactor().data(_plain(self.storage_options))
        return values

    def to_argv(self, *, options_only: bool = False) -> list[str]:
        """`STORE --out RUN_DIR [options]` for a worker: the options whose values differ from
        the defaults, storage options never (they go through the workers' environment).
        `options_only`: without STORE and --out RUN_DIR (a sweep's training options)."""
        argv: list[str] = []
        for option in OPTIONS:
            value = getattr(self, option.name)
            flag = option.flag
            if not option.has_default:  # STORE and --out RUN_DIR
                if not options_only:
                    argv += [str(value)] if flag.positional else [flag.name, str(value)]
            elif option.kind is dict or value == option.default:
                continue
            elif option.kind is bool:
                if value or flag.off is not None:
                    argv.append(flag.name if value else str(flag.off))
            else:
                argv += [flag.name, str(value)]
        return argv

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> TrainConfig:
        """The configuration `python -m landcover.training ARGV` would train with; a bad
        argument is one TrainingError line."""
        config, _ = split_argv(argv, strict=True)
        return config


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """One field of TrainConfig as an option: its flag, the kind of value (int, float, str,
    bool, or dict for the storage options), the choices of a Literal, its default."""

    name: str
    flag: Flag
    kind: type
    choices: tuple[str, ...] | None
    default: Any
    optional: bool  # None is a value (`X | None`)

    @property
    def has_default(self) -> bool:
        return self.default is not MISSING


def _option_specs() -> tuple[OptionSpec, ...]:
    hints = typing.get_type_hints(TrainConfig)
    specs = []
    for f in fields(TrainConfig):
        hint = hints[f.name]
        # `X | None` is X that may be left out
        union = get_origin(hint) in (types.UnionType, typing.Union)
        (kind,) = [a for a in get_args(hint) if a is not type(None)] if union else [hint]
        choices = None
        if get_origin(kind) is Literal:
            choices, kind = tuple(get_args(kind)), str
        elif get_origin(kind) is not None or kind is Mapping:
            kind = dict
        default = {} if f.default_factory is not MISSING else f.default
        optional = union and type(None) in get_args(hint)
        specs.append(OptionSpec(f.name, f.metadata["flag"], kind, choices, default, optional))
    return tuple(specs)


OPTIONS: tuple[OptionSpec, ...] = _option_specs()


def train_options(f: F) -> F:
    """STORE, --out and every training option as click parameters (of `landcover train` and
    the worker command), in TrainConfig's order."""
    for option in reversed(OPTIONS):
        f = _click_decorator(option)(f)
    return f


def _click_decorator(option: OptionSpec) -> Callable[[F], F]:
    flag = option.flag
    if flag.positional:
        return click.argument(option.name, metavar=flag.name)
    if option.kind is dict:
        return storage_options_option
    attrs: dict[str, Any] = {"help": flag.help}
    if not option.has_default:
        attrs["required"] = True
    elif option.kind is bool:
        decls = f"{flag.name}/{flag.off}" if flag.off else flag.name
        attrs.update(default=option.default, show_default=option.default is not None)
        if flag.off is None:
            attrs["is_flag"] = True
        return click.option(decls, option.name, **attrs)
    else:
        attrs.update(default=option.default, show_default=option.default is not None)
    if option.choices is not None:
        attrs["type"] = click.Choice(option.choices)
    elif option.kind is not str:
        attrs["type"] = option.kind
    return click.option(flag.name, option.name, **attrs)


@click.command("worker", add_help_option=False)
@train_options
def _parser(**params: Any) -> None:
    """Parses a worker's argv (never run)."""


def config_from_params(params: Mapping[str, Any]) -> TrainConfig:
    """The TrainConfig of parsed click parameters (other parameters, such as -v, ignored)."""
    return TrainConfig(**{o.name: params[o.name] for o in OPTIONS if o.name in params})


def split_argv(
    argv: Sequence[str], *, strict: bool, given: Mapping[str, Any] | None = None
) -> tuple[TrainConfig, tuple[str, ...]]:
    """The configuration of a worker's argv, and the arguments it does not know: none when
    `strict` (they are refused); a stand-in entry module's own ones otherwise. `given` holds
    field values for what argv leaves out (a sweep's run dir and epochs)."""
    try:
        ctx = _parser.make_context(
            WORKER_PROG,
            list(argv),
            default_map=dict(given or {}),
            ignore_unknown_options=not strict,
            allow_extra_args=not strict,
        )
    except click.UsageError as exc:
        raise TrainingError(f"training arguments: {exc.format_message()}") from None
    return config_from_params(ctx.params), tuple(ctx.args)


def parse_tracking(value: str) -> tuple[str, ...] | None:
    """The backends of a --tracking value: None for auto (decided where the environment is
    read, `landcover.training.tracking`), () for none."""
    text = value.strip().lower()
    if text == "auto":
        return None
    if text == "none":
        return ()
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",")))
    bad = [n for n in names if n not in TRACKING_BACKENDS]
    if bad:
        raise TrainingError(
            f"--tracking {value!r}: {bad[0]!r} is no tracking backend; use auto, none or a comma "
            f"list of {', '.join(TRACKING_BACKENDS)}"
        )
    return names


def _plain(value: Any) -> Any:
    """A JSON value: mappings as dicts, non-finite floats as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value
