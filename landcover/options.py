"""Click options and parameter types shared by the commands and by `TrainConfig` (which
generates the training options): JSON objects, storage options and their worker environment,
--overwrite, an output directory (--out DIR) and a cluster.json (--cluster)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

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
        help='fsspec/adlfs options as JSON, e.g. \'{"account_name": "..."}\'. '
        "az:// also reads AZURE_STORAGE_CONNECTION_STRING / AZURE_STORAGE_ACCOUNT_NAME.",
    )(f)


def storage_options_env(storage_options: Mapping[str, Any]) -> dict[str, str]:
    """The environment that gives workers these storage options (empty when there are none)."""
    if not storage_options:
        return {}
    return {STORAGE_OPTIONS_ENV: json.dumps(dict(storage_options), sort_keys=True)}


def overwrite_option(f: F) -> F:
    """`--overwrite`: replace existing output (never done silently)."""
    return click.option("--overwrite", is_flag=True, help="Replace existing output.")(f)


def out_dir_option(
    help: str, *, required: bool = False, default: str | None = None
) -> Callable[[F], F]:
    """`--out DIR` (parameter `out_dir`, a Path): the directory a command writes into."""
    return _path_option(
        "--out", "out_dir", help, directory=True, required=required, default=default
    )


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
    return click.option(
        flag,
        name,
        type=click.Path(file_okay=not directory, dir_okay=directory, path_type=Path),
        required=required,
        default=default,
        show_default=default is not None,
        help=help,
    )
