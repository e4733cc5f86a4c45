"""Configs whose fields are their command's options: one definition per option.

A config is a frozen dataclass whose fields declare their command-line flag and help
(`tiling.runtime.flags`: `option`, `flag`); the field's type gives the kind of value and, for a
`Literal`, the choices. From that one table come the click options of the command
(`click_options`), the argv that gives a worker the configuration (`config_argv`), its JSON
(`plain`) and, for a field whose type is a `TextValue` (e.g.
`landcover.comm.spec.CompressionSpec`), the one parse of the flag's text (`parse_text_values`,
called by the config's `__post_init__`): the value then travels typed from the flag to where
it acts.

A flag renamed keeps its old spelling for one release (`Flag.deprecated`): hidden from
--help, accepted with the same effect, and warned about on stderr (`deprecated_alias`) once:
by the process that parsed what the user typed, not by each rank that reruns that line
(`ALIASES_WARNED`).

Torch-free: the CLI builds and checks configurations without importing torch.
"""

from __future__ import annotations

import math
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import (
    Any,
    Literal,
    Protocol,
    Self,
    TypeVar,
    cast,
    get_args,
    get_origin,
    runtime_checkable,
)

import click

from landcover.options import storage_options_option
from tiling.runtime.flags import Flag

__all__ = [
    "ALIASES_WARNED",
    "OptionSpec",
    "TextValue",
    "click_options",
    "config_argv",
    "config_option",
    "deprecated_alias",
    "option_specs",
    "parse_text_values",
    "plain",
]

F = TypeVar("F", bound=Callable[..., Any])

# Set in `click.Context.meta` (by an eager option) where a command reruns a line the user typed
# to another process, which warned about its deprecated spellings already: a rank of a job.
ALIASES_WARNED = "landcover.cliconfig.aliases_warned"


@runtime_checkable
class TextValue(Protocol):
    """A typed option value written as text: `parse` reads the flag's text (raising the
    package's error, one line), `str()` writes it back."""

    @classmethod
    def parse(cls, text: str) -> Self: ...


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """One field of a config as an option: its flag, the kind of value (int, float, str, bool,
    a `TextValue` class, or dict for the storage options), the choices of a Literal, its
    default; `multiple`: a tuple of such values, the flag repeated."""

    name: str
    flag: Flag
    kind: type
    choices: tuple[str, ...] | None
    default: Any
    optional: bool  # None is a value (`X | None`)
    multiple: bool = False

    @property
    def has_default(self) -> bool:
        return self.default is not MISSING

    @property
    def text_value(self) -> bool:
        """Whether the value is a `TextValue`: text on a command line, parsed once."""
        return isinstance(self.kind, type) and issubclass(self.kind, TextValue)

    def parse(self, text: str) -> Any:
        """The value of a `TextValue` option given as `text` (one parse, its own errors)."""
        return cast(type[TextValue], self.kind).parse(text)


def option_specs(config_class: type) -> tuple[OptionSpec, ...]:
    """The options of a config class, in its field order: the fields that declare a flag
    (others, such as a parsed region, are set by the command or the library)."""
    namespace = vars(sys.modules[config_class.__module__])
    specs = []
    for f in fields(config_class):
        if "flag" not in f.metadata:
            continue
        # only these annotations are evaluated: the others may name types imported for
        # type checking only (a config module stays free of heavy imports)
        hint = eval(f.type, namespace) if isinstance(f.type, str) else f.type
        # `X | None` is X that may be left out
        union = get_origin(hint) in (types.UnionType, typing.Union)
        (kind,) = [a for a in get_args(hint) if a is not type(None)] if union else [hint]
        choices = None
        multiple = get_origin(kind) is tuple
        if multiple:  # tuple[X, ...]
            kind = get_args(kind)[0]
        if get_origin(kind) is Literal:
            choices, kind = tuple(get_args(kind)), str
        elif get_origin(kind) is not None or kind is Mapping:
            kind = dict
        default = {} if f.default_factory is not MISSING else f.default
        optional = union and type(None) in get_args(hint)
        specs.append(
            OptionSpec(f.name, f.metadata["flag"], kind, choices, default, optional, multiple)
        )
    return tuple(specs)


def parse_text_values(config: Any, specs: tuple[OptionSpec, ...]) -> None:
    """In a frozen config's `__post_init__`: the text given for a `TextValue` field (by a
    command line, the API or a search space) parsed once into its value."""
    for spec in specs:
        value = getattr(config, spec.name)
        if spec.text_value and isinstance(value, str):
            object.__setattr__(config, spec.name, spec.parse(value))


def config_argv(config: Any, specs: tuple[OptionSpec, ...], *, options_only: bool) -> list[str]:
    """The command line that gives `config`: the fields without a default (positionals and
    required options; left out with `options_only`), then the options whose values differ
    from the defaults; dict options (the storage options) never."""
    argv: list[str] = []
    for spec in specs:
        value = getattr(config, spec.name)
        flag = spec.flag
        if not spec.has_default:
            if not options_only:
                argv += [str(value)] if flag.positional else [flag.name, str(value)]
        elif spec.kind is dict or value == spec.default:
            continue
        elif spec.multiple:
            for item in value:
                argv += [flag.name, str(item)]
        elif spec.kind is bool:
            if value or flag.off is not None:
                argv.append(flag.name if value else str(flag.off))
        else:
            argv += [flag.name, str(value)]
    return argv


def config_option(spec: OptionSpec, **click_attrs: Any) -> Callable[[F], F]:
    """One option of a config as a click option, with what the command adds to it
    (`click_attrs`: a callback, a narrower type, a metavar, the command's own default)."""

    def decorate(f: F) -> F:
        for alias in spec.flag.deprecated:
            f = deprecated_alias(alias, spec.flag.name, spec.name, _click_type(spec))(f)
        return _click_decorator(spec, **click_attrs)(f)

    return decorate


def click_options(specs: tuple[OptionSpec, ...]) -> Callable[[F], F]:
    """Every option of `specs` as click parameters, in their order (a deprecated spelling
    as a hidden option beside its flag)."""

    def decorate(f: F) -> F:
        for spec in reversed(specs):
            f = config_option(spec)(f)
        return f

    return decorate


def deprecated_alias(old: str, new: str, name: str, kind: Any = None) -> Callable[[F], F]:
    """`old`, hidden from --help, as a spelling of the option `new` (parameter `name`): the
    same value, and one line on stderr saying to use `new` (unless `ALIASES_WARNED`). Given
    both, the later one wins."""

    def use_for_new(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is None:  # not given (`old` has no default)
            return
        if not ctx.meta.get(ALIASES_WARNED):
            click.echo(f"warning: {old} is deprecated: use {new}", err=True)
        ctx.params[name] = value
        # as if given as `new`: a later `new` still wins, a default never does
        ctx.set_parameter_source(name, click.core.ParameterSource.COMMANDLINE)

    # a parameter of its own: click gives the options of one parameter the same value
    return click.option(
        old, f"{name}_deprecated", type=kind, hidden=True, expose_value=False, callback=use_for_new
    )


def _click_type(spec: OptionSpec) -> Any:
    if spec.choices is not None:
        return click.Choice(spec.choices)
    if spec.kind is str or spec.text_value:
        return click.STRING  # a TextValue is parsed by the config
    return spec.kind


def _click_decorator(spec: OptionSpec, **click_attrs: Any) -> Callable[[F], F]:
    flag = spec.flag
    if flag.positional:
        return click.argument(spec.name, metavar=flag.name)
    if spec.kind is dict:
        return storage_options_option
    attrs: dict[str, Any] = {"help": flag.help}
    if not spec.has_default:
        attrs["required"] = True
    elif spec.kind is bool:
        decls = f"{flag.name}/{flag.off}" if flag.off else flag.name
        attrs.update(default=spec.default, show_default=spec.default is not None)
        if flag.off is None:
            attrs["is_flag"] = True
        return click.option(decls, spec.name, **{**attrs, **click_attrs})
    elif not spec.multiple:  # a repeated option's default is no values
        default = str(spec.default) if spec.text_value else spec.default
        attrs.update(default=default, show_default=spec.default is not None)
    if spec.multiple:
        attrs["multiple"] = True
    if spec.choices is not None or spec.kind is not str:
        attrs["type"] = _click_type(spec)
    return click.option(flag.name, spec.name, **{**attrs, **click_attrs})


def plain(value: Any) -> Any:
    """A JSON value: mappings as dicts, `TextValue`s as their text, non-finite floats as
    null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, TextValue):
        return str(value)
    return value
