"""The `landcover` command. Thin: parse options, build a config, call the library.

Subcommands live in `landcover.commands.*` and are imported only when invoked, so
`landcover info` does not pay for importing torch. Errors of our packages (bad input) are
printed as one line on stderr with exit code 2; anything else is a bug and still gets one
line (exit 3) unless `-v` asks for the traceback.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

import click

from cluster.errors import ClusterError
from landcover.errors import LandcoverError
from tiling.errors import TilingError

USER_ERRORS: tuple[type[BaseException], ...] = (TilingError, LandcoverError, ClusterError)

# name → "module:attribute" of a click command or group
COMMANDS: dict[str, str] = {
    "synth": "landcover.commands.tiling:synth_command",
    "tile": "landcover.commands.tiling:tile_command",
    "info": "landcover.commands.tiling:info_command",
    "train": "landcover.commands.train:train_command",
    "cluster": "landcover.commands.cluster:cluster_group",
    "scale": "landcover.commands.cluster:scale_command",
    "report": "landcover.commands.report:report_group",
    "predict": "landcover.commands.predict:predict_command",
    "evaluate": "landcover.commands.predict:evaluate_command",
    "demo": "landcover.commands.demo:demo_command",
}

SHORT_HELP: dict[str, str] = {
    "synth": "Write synthetic NAIP-like scenes and Chesapeake labels.",
    "tile": "Cut GeoTIFFs into a sharded Zarr v3 chip store.",
    "info": "Describe a chip store.",
    "train": "Train a segmentation model on a chip store (DDP).",
    "cluster": "Plan or launch training on the cluster in cluster.json.",
    "scale": "Train at several worker counts for a scaling curve.",
    "report": "Reports from training runs (scaling curves).",
    "predict": "Predict a land-cover COG for a region.",
    "evaluate": "Score a land-cover raster against truth.",
    "demo": "Run the whole pipeline on generated data.",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        command = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SHORT_HELP.get(name, "")) for name in COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except USER_ERRORS as exc:
            raise UserFacingError(str(exc), exit_code=2) from exc
        except KeyboardInterrupt:
            raise UserFacingError("interrupted", exit_code=130) from None
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as exc:
            if ctx.obj and ctx.obj.get("verbose", 0) > 0:
                raise
            raise UserFacingError(
                f"internal error: {type(exc).__name__}: {exc} (rerun with -v for the traceback)",
                exit_code=3,
            ) from exc


class UserFacingError(click.ClickException):
    """One line on stderr, no traceback."""

    def __init__(self, message: str, *, exit_code: int) -> None:
        super().__init__(message.splitlines()[0] if message else "error")
        self.exit_code = exit_code  # type: ignore[misc]

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
@click.version_option(package_name="landcover")
@click.pass_context
def main(ctx: click.Context, verbose: int, quiet: bool) -> None:
    """landcover: aerial imagery to land-cover maps at scale."""
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose
    ctx.obj["quiet"] = quiet
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    logging.basicConfig(
        level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


if __name__ == "__main__":  # pragma: no cover
    main()
