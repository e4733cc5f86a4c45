"""The torch that pyproject.toml admits: none where a model file could run code.

`torch.load(weights_only=True)` is what keeps a model file from running code (docs/CONTRACTS.md);
before torch 2.6 it could be bypassed (CVE-2025-32434), so the floor is 2.6 and torchvision's the
release built against it (0.21). The lock file's pins must satisfy the floor.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[3]
FLOORS = {"torch": Version("2.6"), "torchvision": Version("0.21")}


def requirement(name: str) -> Requirement:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    found = [Requirement(r) for r in project["project"]["dependencies"]]
    (req,) = [r for r in found if r.name == name]
    return req


@pytest.mark.parametrize("name", sorted(FLOORS))
def test_no_version_below_the_floor_is_admitted(name: str) -> None:
    req = requirement(name)
    floor = FLOORS[name]
    below = Version(f"{floor.major}.{floor.minor - 1}.99")
    assert not req.specifier.contains(below, prereleases=True), req
    assert req.specifier.contains(floor), req


@pytest.mark.parametrize("name", sorted(FLOORS))
def test_the_lock_file_pins_satisfy_the_floor(name: str) -> None:
    pins = {
        line.split("==")[0].strip().lower().replace("_", "-"): Version(line.split("==")[1].strip())
        for line in (REPO / "requirements.lock").read_text(encoding="utf-8").splitlines()
        if "==" in line and not line.lstrip().startswith("#")
    }
    assert requirement(name).specifier.contains(pins[name], prereleases=True)
