"""Click options and parameter types shared by the commands and by `TrainConfig` (which
generates the training options): JSON objects, storage options and their worker environment,
--overwrite, an output directory (--out DIR) and a cluster.json (--cluster), and the one check
of where a command can write (`check_output_url`: local paths everywhere, az:// where the
command uploads)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from landcover.errors import OutputError
from landcover.outputs import check_output_format, local_output

F = TypeVar("F", bound=Callable[..., Any])


_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


class JsonObject(click.ParamType):  # type: ignore[type-arg]
    """A JSON object given on the command line, e.g. `--storage-options '{"a": 1}'`."""

    name = "json"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, dict):
            return value
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            # The value is not echoed: it may hold an account key.
            self.fail(
                f"not valid JSON ({exc.msg} at character {exc.pos}); pass an object like "
                '\'{"account_name": "..."}\'',
                param,
                ctx,
            )
        if not isinstance(parsed, dict):
            kind = _JSON_KINDS.get(type(parsed), "value")
            self.fail(f'a JSON {kind}, not an object like \'{{"key": "value"}}\'', param, ctx)
        return parsed


# Where launchers put the storage options for their workers: an account key on a worker's
# command line could be read by any user of the machine (`ps`), its environment only by its owner.
STORAGE_OPTIONS_ENV = "LANDCOVER_STORAGE_OPTIONS"


# ctx.meta key: True when this command line's storage options came from STORAGE_OPTIONS_ENV
# (the CLI's error mapping then names the variable: a user who did not type --storage-options
# would not look for them there)
STORAGE_OPTIONS_FROM_ENV = "landcover.storage_options_from_env"


def storage_options_option(f: F) -> F:
    """`--storage-options JSON` (or $LANDCOVER_STORAGE_OPTIONS): passed to fsspec/adlfs for
    every URL the command opens."""
    return click.option(
        "--storage-options",
        type=JsonObject(),
        default="{}",
        show_default=True,
        envvar=STORAGE_OPTIONS_ENV,
        show_envvar=True,
        callback=_remember_storage_source,
        help='fsspec/adlfs options as JSON, e.g. \'{"account_name": "..."}\'. '
        "az:// also reads AZURE_STORAGE_CONNECTION_STRING / AZURE_STORAGE_ACCOUNT_NAME.",
    )(f)


def _remember_storage_source(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if param.name is not None:
        source = ctx.get_parameter_source(param.name)
        ctx.meta[STORAGE_OPTIONS_FROM_ENV] = source is click.core.ParameterSource.ENVIRONMENT
    return value


def storage_options_env(storage_options: Mapping[str, Any]) -> dict[str, str]:
    """The environment that gives workers these storage options (empty when there are none)."""
    if not storage_options:
        return {}
    return {STORAGE_OPTIONS_ENV: json.dumps(dict(storage_options), sort_keys=True)}


def check_output_url(url: str, *, option: str, remote: bool = False) -> None:
    """Refuse, before any work, an output `url` (given as `option`) of a scheme the command
    cannot write: every command writes local paths (and file:// URLs); `remote` ones also
    az:// (abfs://, abfss://). Any other scheme (s3://, http://, memory://, a typo) would fail
    late, vanish with the process (memory://) or land in a local folder named after the
    scheme ("az:/container/..."). Raises `OutputError`."""
    from tiling.runtime.urls import AZURE_PROTOCOLS, is_local, protocol  # zarr: only when checking

    scheme = protocol(url)
    # "run:1" is a local name; only "scheme://" makes a URL of it
    if "://" not in url or is_local(url) or (remote and scheme in AZURE_PROTOCOLS):
        return
    if remote:
        supported = "a local path or an az://container/path URL (also abfs://, abfss://)"
    else:
        supported = "a local path (this output cannot go to object storage)"
    raise OutputError(f"{option} {url}: cannot write {scheme}:// URLs; give {supported}")


def output_url_callback(
    *, remote: bool = False, formats: Sequence[str] = (), example: str = ""
) -> Callable[..., Any]:
    """A click callback for an output option or argument that passes its value to
    `check_output_url` (None, an option not given, passes) and returns it with a file:// URL
    made a plain local path (`landcover.outputs.local_output`): every writer, and the
    quicklook or page written from the output afterwards, takes the path. With `formats`
    (suffixes, e.g. (".html",)), a name that says another format is refused
    (`check_output_format`, suggesting `example`)."""

    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None:
            label = _param_label(param)
            check_output_url(str(value), option=label, remote=remote)
            if formats:
                check_output_format(str(value), option=label, expected=formats, example=example)
            if isinstance(value, str):
                return local_output(value)
        return value

    return check


class LocalOutputPath(click.Path):
    """`click.Path` for an output that must be local: `check_output_url` on the text as given,
    before click makes a Path of it (which would show "az://c/x" as "az:/c/x")."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            check_output_url(value, option=_param_label(param))
            value = local_output(value)
        return super().convert(value, param, ctx)


def _param_label(param: click.Parameter | None) -> str:
    """How the messages name a parameter: its flag (--out) or its metavar (OUT_DIR)."""
    if param is None:
        return "output"
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.human_readable_name


def overwrite_option(f: F) -> F:
    """`--overwrite`: replace existing output (never done silently)."""
    return click.option("--overwrite", is_flag=True, help="Replace existing output.")(f)


def out_dir_option(
    help: str, *, required: bool = False, default: str | None = None
) -> Callable[[F], F]:
    """`--out DIR` (parameter `out_dir`, a Path): the local directory a command writes into
    (a URL is refused: `LocalOutputPath`)."""
    return _path_option(
        "--out", "out_dir", help, directory=True, required=required, default=default
    )


def out_url_option(help: str, *, name: str = "out_dir", required: bool = False) -> Callable[[F], F]:
    """`--out` (parameter `name`, a str or None): what a command writes, a local path or a URL
    checked by `output_url_callback` (a file:// URL made a plain path)."""
    return click.option("--out", name, required=required, callback=output_url_callback(), help=help)


def cluster_json_option(help: str) -> Callable[[F], F]:
    """`--cluster FILE` (parameter `cluster_json`, a Path or None): the cluster.json to run on."""
    return _path_option("--cluster", "cluster_json", help, directory=False)


def _path_option(
    flag: str,
    name: str,
    help: str,
    *,
    directory: bool,
    required: bool = False,
    default: str | None = None,
) -> Callable[[F], F]:
    path_type = LocalOutputPath if directory else click.Path
    return click.option(
        flag,
        name,
        type=path_type(file_okay=not directory, dir_okay=directory, path_type=Path),
        required=required,
        default=default,
        show_default=default is not None,
        help=help,
    )
