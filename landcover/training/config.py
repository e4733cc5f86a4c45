"""`TrainConfig`: every option of a training run, identical on every rank, and the one
definition of those options.

Each field declares its command-line flag and help (`tiling.runtime.flags.option`); its type
gives the kind of value and, for a `Literal`, the choices. From that one table come the click
options of `landcover train` and of the worker (`train_options`), the checks
(`TrainConfig.__post_init__`), the argv that gives a worker this configuration (`to_argv`, a
typed serialisation: field by field through the table, never a scan of tokens) and the parse
of training arguments by click (`parse_training`: the worker's options, or `landcover
train`'s for what a user gives a launcher, which then refuses by parameter, not by token,
the options it sets itself). `--compression` is parsed once, here, into a
`CompressionSpec` that travels typed to the comm hook.

The storage options never go into an argv: a launcher gives them to its workers through their
environment (`landcover.options.storage_options_env`), where `--storage-options` falls back
to reading them. Torch-free, so the CLI and the launchers can build and check a configuration
without paying for importing torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar

import click

from cluster.redact import Redactor
from landcover.cliconfig import (
    OptionSpec,
    click_options,
    config_argv,
    option_specs,
    parse_text_values,
    plain,
)
from landcover.comm.spec import CompressionSpec
from landcover.errors import TrainingError
from landcover.models.weightsource import check_pretrained_value
from tiling.runtime.flags import flag, option

Optimizer = Literal["adamw", "sgd"]
Loss = Literal["ce", "ce+dice"]
ClassWeights = Literal["auto", "none"]
Device = Literal["auto", "cpu", "cuda"]
LrScaling = Literal["linear", "sqrt", "none"]
TRACKING_BACKENDS = ("tensorboard", "mlflow")
DEFAULT_LR: Mapping[str, float] = {"adamw": 2e-3, "sgd": 0.02}
WORKER_PROG = "python -m landcover.training"

F = TypeVar("F", bound=Callable[..., Any])


_BMUF = "BMUF: "


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Everything a training run needs; built by the CLI, identical on every rank."""

    store_url: str = field(metadata=flag("STORE"))
    out_dir: str = field(metadata=flag("--out", "Run directory (RUN_DIR)."))
    model: str = option(
        "--model",
        "small_unet",
        "Model registry name, or smp:ARCH:ENCODER (e.g. smp:Unet:resnet34); `landcover models` "
        "lists them.",
    )
    pretrained: str | None = option(
        "--pretrained",
        None,
        "Start the encoder from weights: imagenet (from the local torch hub / Hugging Face "
        "cache) or PATH of an encoder state dict (.pth, .safetensors).",
    )
    epochs: int = option("--epochs", 10)
    batch_size: int = option("--batch-size", 16, "Chips per step per worker.")
    lr: float | None = option(
        "--lr",
        None,  # DEFAULT_LR of the optimizer
        "Base learning rate (default 2e-3 adamw, 0.02 sgd), scaled by the world size per "
        "--lr-scaling, linear warm-up then cosine decay.",
    )
    lr_scaling: LrScaling = option(
        "--lr-scaling",
        "linear",
        "How the base lr grows with the number of workers (not with BMUF).",
    )
    warmup_epochs: float = option("--warmup-epochs", 1.0)
    weight_decay: float = option("--weight-decay", 1e-4)
    optimizer: Optimizer = option("--optimizer", "adamw")
    loss: Loss = option("--loss", "ce", "Cross-entropy ignoring nodata, optionally + Dice.")
    class_weights: ClassWeights = option(
        "--class-weights", "auto", "auto: median-frequency weights from the store's class counts."
    )
    augment: bool = option(
        "--augment", True, "Random flips and 90-degree rotations.", off="--no-augment"
    )
    brightness_jitter: float = option(
        "--brightness-jitter",
        0.2,
        "With --augment, scale each chip's bands by a random gain in [1-J, 1+J] and each band "
        "by one in [1-J/2, 1+J/2], so that the model does not learn one tile's brightness "
        "(0: off; the default was chosen by benchmarks/bench_quality.py).",
    )
    seed: int = option("--seed", 0)
    patience: int | None = option(
        "--patience", None, "Stop after this many epochs without a better val mIoU."
    )
    resume: bool = option(
        "--resume",
        False,
        "Continue from RUN_DIR/checkpoints/last.pt; without one, start fresh only when RUN_DIR "
        "holds no trained result (model.pt, metrics.jsonl).",
    )
    overwrite: bool = option("--overwrite", False, "Replace existing output.")
    device: Device = option("--device", "auto")
    amp: bool | None = option(
        "--amp", None, "bf16 autocast (default: on for CUDA, off on CPU).", off="--no-amp"
    )
    threads: int | None = option(
        "--threads", None, "Torch threads per worker (default: cores / local workers)."
    )
    # never in an argv: workers read them from their environment (see the module docstring)
    storage_options: Mapping[str, Any] = field(
        default_factory=dict, metadata=flag("--storage-options")
    )
    # text from a command line or the API is parsed once, in __post_init__
    compression: CompressionSpec = option(
        "--compression",
        CompressionSpec(),
        "DDP gradient compression: none, fp16, bf16, powersgd[:RANK], onebit.",
    )
    block_momentum: bool = option(
        "--block-momentum",
        False,
        "BMUF: local steps, then a block-level model average with momentum.",
    )
    block_size: int = option(
        "--bmuf-block-steps", 8, _BMUF + "local steps per block.", deprecated=("--block-size",)
    )
    block_momentum_value: float | None = option(
        "--block-momentum-value", None, "BMUF block momentum (default 1 - 1/workers)."
    )
    block_lr: float = option("--block-lr", 1.0, "BMUF block learning rate.")
    nesterov: bool = option(
        "--nesterov", True, _BMUF + "Nesterov-style block momentum.", off="--no-nesterov"
    )
    reset_local_momentum: bool = option(
        "--reset-local-momentum",
        True,
        _BMUF + "zero each worker's optimizer momentum after every block end.",
        off="--keep-local-momentum",
    )
    allow_incomplete: bool = option(
        "--allow-incomplete",
        False,
        "Train on a store whose tiling was interrupted (default: refuse it).",
    )
    sync_bn: bool = option(
        "--sync-bn",
        False,
        "SyncBatchNorm: normalise with the whole step's batch statistics (CUDA only; without "
        "it, BatchNorm statistics are averaged over the workers after every epoch).",
    )
    tracking: str = option(
        "--tracking",
        "auto",
        "Experiment tracking besides metrics.jsonl: a comma list of tensorboard, mlflow; none; "
        "auto: tensorboard, and mlflow too when MLFLOW_TRACKING_URI is set.",
    )
    log_every: int = option(
        "--log-every",
        50,
        "Without a terminal, also log a progress line every N steps (0: epoch lines only).",
    )

    def __post_init__(self) -> None:
        parse_text_values(self, OPTIONS)
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
            (self.block_size >= 1, f"--bmuf-block-steps {self.block_size} must be >= 1"),
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
                not (self.block_momentum and self.compression.compresses),
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
        check_pretrained_value(self.pretrained)
        parse_tracking(self.tracking)

    @property
    def base_lr(self) -> float:
        return self.lr if self.lr is not None else DEFAULT_LR[self.optimizer]

    def to_json(self) -> dict[str, Any]:
        """Plain values for run.json and checkpoints; secrets in storage options redacted
        (`cluster.redact`: secret-named keys, and secret-looking text such as SAS signatures)."""
        values = {f.name: plain(getattr(self, f.name)) for f in fields(self)}
        values["storage_options"] = Redactor().data(plain(self.storage_options))
        return values

    def to_argv(self, *, options_only: bool = False) -> list[str]:
        """`STORE --out RUN_DIR [options]` for a worker: the options whose values differ from
        the defaults, storage options never (they go through the workers' environment).
        `options_only`: without STORE and --out RUN_DIR (a sweep's training options)."""
        return config_argv(self, OPTIONS, options_only=options_only)

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> TrainConfig:
        """The configuration `python -m landcover.training ARGV` would train with; a bad
        argument is one TrainingError line."""
        return parse_training(argv).config


OPTIONS: tuple[OptionSpec, ...] = option_specs(TrainConfig)


def train_options(f: F) -> F:
    """STORE, --out and every training option as click parameters (of `landcover train` and
    the worker command), in TrainConfig's order."""
    return click_options(OPTIONS)(f)


nproc_option = click.option(
    "--nproc",
    type=int,
    default=1,
    show_default=True,
    help="Local worker processes (torchrun); 1 trains in this process.",
)
"""`landcover train`'s own option beside the training options; a launcher's parse of training
arguments (`train_parser`) knows it too, to refuse it by name."""


@click.command("worker", add_help_option=False)
@train_options
def _parser(**params: Any) -> None:
    """Parses a worker's argv (never run)."""


@click.command("train", add_help_option=False)
@train_options
@nproc_option
def train_parser(**params: Any) -> None:
    """Parses training arguments as `landcover train` takes them (never run): what a sweep
    or a search is given after `--`."""


@dataclass(frozen=True, slots=True)
class ParsedTraining:
    """Training arguments parsed by a command's click options."""

    config: TrainConfig
    given: frozenset[str]  # the parameters the arguments set (not a default, not `defaults`)
    extra_args: tuple[str, ...]  # a stand-in entry module's own arguments (none when strict)

    def refuse_given(self, names: Sequence[str], error: Callable[[str], Exception]) -> None:
        """Raise `error(flag)` for the first of the parameters `names` that the arguments
        set, `flag` being its option (`--out`, `--nproc`)."""
        for name in names:
            if name in self.given:
                raise error(flag_of(name))


def flag_of(name: str) -> str:
    """The option of parameter `name` (a TrainConfig field, or `nproc`)."""
    flags = {o.name: o.flag.name for o in OPTIONS}
    return flags.get(name, "--" + name.replace("_", "-"))


def parse_training(
    args: Sequence[str],
    *,
    command: click.Command = _parser,
    defaults: Mapping[str, Any] | None = None,
    strict: bool = True,
    prog: str = WORKER_PROG,
    if_missing: Mapping[str, str] | None = None,
) -> ParsedTraining:
    """`args` parsed by `command`'s click options (the worker's by default; `landcover
    train`'s, or `train_parser`, for what a user gives a launcher) into the configuration,
    which parameters they set, and the arguments `command` does not know: refused when
    `strict`, a stand-in entry module's own otherwise. `defaults` holds values for what
    `args` leaves out (a sweep's run dir and epochs, cluster.json's store). A bad argument is
    one TrainingError line; `if_missing` holds the line for a missing parameter by name.
    """
    try:
        ctx = command.make_context(
            prog,
            list(args),
            default_map=dict(defaults or {}),
            ignore_unknown_options=not strict,
            allow_extra_args=not strict,
        )
    except click.MissingParameter as exc:
        name = exc.param.name if exc.param is not None else None
        if name is not None and name in (if_missing or {}):
            raise TrainingError((if_missing or {})[name]) from None
        raise TrainingError(f"training arguments: {exc.format_message()}") from None
    except click.UsageError as exc:
        raise TrainingError(f"training arguments: {exc.format_message()}") from None
    source = click.core.ParameterSource.COMMANDLINE
    given = frozenset(n for n in ctx.params if ctx.get_parameter_source(n) is source)
    return ParsedTraining(config_from_params(ctx.params), given, tuple(ctx.args))


def config_from_params(params: Mapping[str, Any]) -> TrainConfig:
    """The TrainConfig of parsed click parameters (other parameters, such as -v, ignored)."""
    return TrainConfig(**{o.name: params[o.name] for o in OPTIONS if o.name in params})


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
