"""One input under two names (a path and ./path or its absolute path, a symlink and its target,
a hard link, a STAC href and the path, the same URL twice or spelled two ways) is read once,
with a warning naming both, by every command that reads inputs."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.landcover.cli.readers import (
    READERS,
    Scene,
    http_files,
    inputs_read,
    run,
)
from tests.tiling.stacfiles import raster_item, write_item_collection
from tiling.sources.inputs import input_identity, resolve_inputs


def relative(path: Path) -> str:
    return os.path.relpath(path)


def symlink(path: Path) -> str:
    link = path.parent / f"link-to-{path.name}"
    if not link.exists():
        link.symlink_to(path)
    return str(link)


def hard_link(path: Path) -> str:
    link = path.parent / f"hard-{path.name}"
    if not link.exists():
        os.link(path, link)
    return str(link)


def stac_document(path: Path) -> str:
    item = raster_item(path, item_id="scene", year=2021)
    return str(write_item_collection([item], path.parent / f"{path.stem}-items.json"))


# Each: (the first name, the second name) of the command's raster, local ones
LOCAL_NAMES: dict[str, Callable[[Path], tuple[str, str]]] = {
    "relative and absolute": lambda p: (relative(p), str(p)),
    "./ and plain": lambda p: ("./" + relative(p), relative(p)),
    "a/../a": lambda p: (str(p.parent / ".." / p.parent.name / p.name), str(p)),
    "symlink and target": lambda p: (str(p), symlink(p)),
    "hard link": lambda p: (str(p), hard_link(p)),
    "the same path twice": lambda p: (str(p), str(p)),
    "a STAC href and the path": lambda p: (relative(p), stac_document(p)),
}


@pytest.mark.parametrize("command", READERS)
@pytest.mark.parametrize("names", LOCAL_NAMES)
def test_one_file_under_two_names_is_read_once(
    reader_scene: Scene, tmp_path: Path, command: str, names: str, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = LOCAL_NAMES[names](reader_scene.raster(command))
    result = run(reader_scene.args(command, [first, second], tmp_path))
    assert inputs_read(command, result) == 1
    (note,) = [r.getMessage() for r in caplog.records if r.name == "tiling.sources.inputs"]
    assert note.endswith("; reading it once")


URL_NAMES: dict[str, Callable[[str], tuple[str, str]]] = {
    "the same URL twice": lambda url: (url, url),
    "a ./ segment": lambda url: (
        url,
        url.replace("/scene", "/./scene").replace("/truth", "/./truth"),
    ),
}


@pytest.mark.parametrize("command", READERS)
@pytest.mark.parametrize("names", URL_NAMES)
def test_one_url_under_two_names_is_read_once(
    reader_scene: Scene, tmp_path: Path, command: str, names: str, caplog: pytest.LogCaptureFixture
) -> None:
    raster = reader_scene.raster(command)
    with http_files(raster.parent) as base:
        first, second = URL_NAMES[names](f"{base}/{raster.name}")
        result = run(reader_scene.args(command, [first, second], tmp_path))
    assert inputs_read(command, result) == 1
    (note,) = [r.getMessage() for r in caplog.records if r.name == "tiling.sources.inputs"]
    assert second in note and note.endswith("; reading it once")


def test_identity_is_the_file_or_the_normalised_url(tmp_path: Path) -> None:
    a, b = tmp_path / "a.tif", tmp_path / "b.tif"
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    assert input_identity(str(a)) == input_identity(f"file://{a}") == input_identity(symlink(a))
    assert input_identity(str(a)) != input_identity(str(b))
    url = "https://host.example/naip/a.tif?sig=x"
    assert input_identity(url) == input_identity("https://HOST.example:443/naip/a.tif?sig=x#f")
    assert input_identity(url) != input_identity("https://host.example/naip/A.tif?sig=x")
    assert input_identity(url) != input_identity("https://host.example/naip/a.tif?sig=y")
    assert input_identity(url) == input_identity("https://host.example/x/../naip/./a.tif?sig=x")
    assert input_identity("az://c/a.tif") == input_identity("abfs://c/a.tif")


def test_a_stac_item_of_a_file_given_as_a_path_keeps_the_path(reader_scene: Scene) -> None:
    """The item still describes the raster (predict's --stac-item cites it), under the name
    the raster is read by."""
    resolved = resolve_inputs([relative(reader_scene.image), stac_document(reader_scene.image)])
    assert resolved.paths == (relative(reader_scene.image),)
    assert [(s.item_id, s.href) for s in resolved.stac_items] == [
        ("scene", relative(reader_scene.image))
    ]


def test_every_name_is_read_when_the_files_differ(reader_scene: Scene, tmp_path: Path) -> None:
    copy = tmp_path / "copy.tif"
    copy.write_bytes(reader_scene.image.read_bytes())
    result = run(reader_scene.args("predict", [str(reader_scene.image), str(copy)], tmp_path))
    assert inputs_read("predict", result) == 2


def test_an_existing_file_whose_name_holds_glob_characters_is_that_file(tmp_path: Path) -> None:
    # "x [1].tif" as a glob matches "x 1.tif": the file the user named must win
    named = tmp_path / "x [1].tif"
    decoy = tmp_path / "x 1.tif"
    named.write_bytes(b"named")
    decoy.write_bytes(b"decoy")
    assert resolve_inputs([str(named)]).paths == (str(named),)
    assert resolve_inputs([str(tmp_path / "x [1]*.tif")]).paths == (str(decoy),)
