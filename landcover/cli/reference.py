"""The CLI reference as Markdown: every command and subcommand of a click group with its
`--help` text, as click prints it. The documentation site's `reference/cli.md` is this page."""

from __future__ import annotations

from collections.abc import Iterator

import click


def walk_commands(
    command: click.Command, ctx: click.Context
) -> Iterator[tuple[click.Command, click.Context]]:
    """`command` and then every subcommand below it, depth first in the group's listed order,
    each with the context `--help` would see (its parents' contexts above it)."""
    yield command, ctx
    if not isinstance(command, click.Group):
        return
    for name in command.list_commands(ctx):
        sub = command.get_command(ctx, name)
        if sub is None or sub.hidden:
            continue
        yield from walk_commands(sub, click.Context(sub, info_name=name, parent=ctx))


def render_cli_reference(group: click.Command, *, prog_name: str) -> str:
    """One Markdown page: a heading per command (`## landcover tile`) and its `--help` text in
    a code block, at a fixed width so the page does not depend on the terminal."""
    root = click.Context(group, info_name=prog_name, terminal_width=100, max_content_width=100)
    lines = [
        "# CLI reference",
        "",
        f"Every `{prog_name}` command and subcommand with its `--help` text, generated from the "
        "command definitions when the site is built.",
        "",
    ]
    for command, ctx in walk_commands(group, root):
        with ctx:
            help_text = command.get_help(ctx)
        lines += [f"## {ctx.command_path}", "", "```text", help_text.rstrip(), "```", ""]
    return "\n".join(lines)
