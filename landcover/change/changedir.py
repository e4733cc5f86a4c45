"""A change output directory: it holds one change. What it holds (the files its record lists,
and those of a run that died while replacing it), the refusal of anything else without
`--overwrite`, and the lock a run holds while it replaces the directory's change."""

from __future__ import annotations

import fcntl
import glob
import json
import logging
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from landcover.change.transitions import CHANGE_RECORD, read_change_record
from landcover.errors import ChangeError
from landcover.outputs import check_directory_output

__all__ = [
    "CHANGE_REPORTS",
    "LOCK",
    "MOSAIC",
    "PENDING",
    "SCRATCH_PREFIX",
    "change_files",
    "check_change_directory",
    "claimed",
    "vrt_sources",
]

logger = logging.getLogger(__name__)

CHANGE_REPORTS = (CHANGE_RECORD, "change.md", "change.png")
MOSAIC = "mosaic.vrt"  # the change map of a tiled product: a VRT over a change tile per tile
LOCK = ".change.lock"  # held while a run writes the directory
SCRATCH_PREFIX = ".change-"  # a run's work directory inside the output directory
PENDING = ".change.pending.json"  # the files a run replaces or removes, until it is done


def check_change_directory(out: Path, *, overwrite: bool) -> set[str]:
    """The files of the change already in `out` (its record's, and those of a run that died
    while replacing it); refuses an `out` that holds anything (hidden files aside) without
    `overwrite`: a change directory holds one change. Files of no change are left alone."""
    if not out.is_dir():
        return set()
    owned = change_files(out)
    # the one rule of a directory output (outputs): refused when it holds anything
    mine = check_directory_output(out, overwrite=overwrite, what="change", owned=owned.__contains__)
    kept = [e.name for e in out.iterdir() if not e.name.startswith(".") and e.name not in mine]
    if kept:
        logger.warning("keeping %d file(s) that are not the change's in %s", len(kept), out)
    return owned


def change_files(out: Path) -> set[str]:
    """The names of the change's files in `out`: those its record lists (for a tiled change
    without that list, the sources of its mosaic), and those a run that died while replacing
    it meant to write or remove (its pending list)."""
    names: set[str] = set()
    try:
        listed = json.loads((out / PENDING).read_text(encoding="utf-8"))
        names |= {str(n) for n in listed if Path(str(n)).name == str(n)}
    except (OSError, ValueError, TypeError):
        pass
    try:
        record = read_change_record(out)
    except ChangeError:
        record = None
    if record is not None:
        names |= {*CHANGE_REPORTS, record.map_name, *record.files}
        if record.map_name == MOSAIC and not record.files:
            names |= vrt_sources(out / MOSAIC)
    return names


def vrt_sources(vrt: Path) -> set[str]:
    """The names of the files beside `vrt` that it reads."""
    try:
        root = ET.parse(vrt).getroot()
    except (OSError, ET.ParseError):
        return set()
    names = {(e.text or "").strip() for e in root.iter("SourceFilename")}
    return {n for n in names if n and Path(n).name == n}


@contextmanager
def claimed(out: Path, names: Sequence[str]) -> Iterator[None]:
    """`out` held by this run alone (an flock on its hidden LOCK file, removed at the end);
    once held, what a run killed there left behind is removed: its scratch directories and
    the temp files of the change's `names`."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / LOCK, "a+b") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ChangeError(
                f"--out {out}: another `landcover change` is writing it; wait for it to end, "
                "or choose another --out"
            ) from None
        for entry in out.glob(f"{SCRATCH_PREFIX}*"):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
        for name in {*names, PENDING}:
            for leftover in out.glob(f".{glob.escape(name)}.*.tmp"):
                leftover.unlink(missing_ok=True)
        try:
            yield
        finally:
            (out / LOCK).unlink(missing_ok=True)  # still held: no other run waits on it
