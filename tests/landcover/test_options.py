"""Options across the commands (`landcover.options` and the checks each command calls), each
class run through the CLI against every command it applies to:

- an output URL of a scheme the command cannot write (`check_output_url`): one line naming
  the option, the scheme and what is supported, exit 2, before any work and with nothing
  written (not even a local folder named after the scheme, "s3:/bucket/...");
- `--storage-options` with nothing but local paths (`tiling.runtime.urls.check_storage_options`):
  refused by every command that takes them, the keys named and their values not shown;
- an option value the command would ignore or quietly change: refused with one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import Result

from landcover.errors import OutputError
from landcover.options import check_output_url
from tests.landcover.evaluation.maps import TRUTH_RAW, write, write_prediction
from tests.landcover.prediction.inputs import pixels, write_image, write_model
from tests.support.cli import invoke

# Every output of every command: (name, command line with {url} where the output goes, the
# option the message names, whether the command writes az:// too). The inputs need not exist:
# the check comes before any is read.
OUTPUTS: list[tuple[str, str, str, bool]] = [
    ("synth", "synth {url}", "OUT_DIR", False),
    ("tile", "tile a.tif --out {url}", "--out", True),
    ("train", "train chips.zarr --out {url}", "--out", False),
    ("tune", "tune chips.zarr --trials 1 --epochs 1 --space lr=1e-4:1e-2 --out {url}", "--out",
     False),
    ("scale", "scale chips.zarr --workers 1 --epochs 1 --out {url}", "--out", False),
    ("demo", "demo --out {url}", "--out", False),
    ("report scaling", "report scaling runs --out {url}", "--out", False),
    ("cluster plan", "cluster plan c.json --out {url} -- train s.zarr --out /shared/run", "--out",
     False),
    ("export", "export model.pt --format onnx --out {url}", "--out", False),
    ("evaluate", "evaluate lc.tif --truth t.tif --out {url}", "--out", False),
    ("predict --out", "predict model.pt a.tif --out {url}", "--out", True),
    ("predict --probabilities", "predict model.pt a.tif --out lc.tif --probabilities {url}",
     "--probabilities", True),
    ("predict --stac-item", "predict model.pt a.tif --out lc.tif --stac-item {url}",
     "--stac-item", False),
]  # fmt: skip
# az:// is what the remote outputs support; the rest no output does.
SCHEMES = ("az://container/x", "s3://bucket/x", "http://host/x", "memory://x", "gs://bucket/x")


def one_error_line(result: Result) -> str:
    """The command failed with exit 2 and one line on stderr, no traceback; returns it."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


UNWRITABLE = [
    pytest.param(line.format(url=url).split(), option, remote, url, id=f"{name}-{url[:5]}")
    for name, line, option, remote in OUTPUTS
    for url in SCHEMES
    if not (remote and url.startswith("az://"))
]


@pytest.mark.parametrize(("args", "option", "remote", "url"), UNWRITABLE)
def test_an_output_url_the_command_cannot_write_is_refused_before_any_work(
    args: list[str],
    option: str,
    remote: bool,
    url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheme = url.split("://")[0]
    monkeypatch.chdir(tmp_path)
    line = one_error_line(invoke(*args))
    supported = "a local path or an az://" if remote else "give a local path"
    assert line.startswith(f"error: {option} {url}: cannot write {scheme}:// URLs; "), line
    assert supported in line
    assert not list(tmp_path.iterdir())  # no "s3:" folder, nothing begun


@pytest.mark.parametrize(
    ("url", "remote"),
    [
        ("lc.tif", False),
        ("/data/lc.tif", False),
        ("file:///data/lc.tif", False),
        ("run:1", False),  # a local name with a colon
        ("az://maps/lc.tif", True),
        ("abfs://maps/lc.tif", True),
        ("abfss://maps/lc.tif", True),
    ],
)
def test_local_paths_pass_everywhere_and_az_only_where_the_command_uploads(
    url: str, remote: bool
) -> None:
    check_output_url(url, option="--out", remote=remote)
    if remote:
        with pytest.raises(OutputError, match=rf"^--out {re.escape(url)}: cannot write "):
            check_output_url(url, option="--out")


# -- --storage-options with local paths only ---------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    model: Path
    scene: Path
    prediction: Path
    truth: Path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    root = tmp_path_factory.mktemp("options")
    return Inputs(
        model=write_model(root / "model.pt", seed=1),
        scene=write_image(root / "scene.tif", pixels(40, 45, seed=2)),
        prediction=write_prediction(root / "pred.tif"),
        truth=write(root / "truth.tif", TRUTH_RAW),
    )


SECRET = "s3cret"
STORAGE = ["--storage-options", f'{{"account_name": "acct", "account_key": "{SECRET}"}}']


def _storage_commands(i: Inputs, out: Path) -> dict[str, list[str]]:
    return {
        "tile": ["tile", str(i.scene), "--out", str(out / "chips.zarr"), "--chip-size", "16"],
        "info": ["info", str(out / "chips.zarr")],
        "train": ["train", str(out / "chips.zarr"), "--out", str(out / "run"), "--epochs", "1"],
        "predict": ["predict", str(i.model), str(i.scene), "--out", str(out / "lc.tif")],
        "evaluate": [
            "evaluate",
            str(i.prediction),
            "--truth",
            str(i.truth),
            "--out",
            str(out / "eval"),
        ],
        "export": [
            "export",
            str(i.model),
            "--format",
            "torchscript",
            "--out",
            str(out / "m.torchscript"),
        ],
    }


@pytest.mark.parametrize("name", ["tile", "info", "train", "predict", "evaluate", "export"])
def test_storage_options_for_local_paths_are_refused_by_every_command(
    name: str, inputs: Inputs, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    line = one_error_line(invoke(*_storage_commands(inputs, out)[name], *STORAGE))
    assert "--storage-options (account_key, account_name) do not apply to local paths" in line
    assert "drop --storage-options" in line and SECRET not in line
    assert not out.exists()


# -- option values a command would ignore or change ----------------------------------------------


def _ignored_values(i: Inputs, out: Path) -> dict[str, tuple[list[str], str]]:
    predict = ["predict", str(i.model), str(i.scene), "--out", str(out / "lc.tif")]
    export = ["export", str(i.model), "--out", str(out / "m.onnx")]
    return {
        "export --opset 7": (
            [*export, "--format", "onnx", "--opset", "7"],
            "--opset 7: the installed exporter writes ONNX opsets 18 to ",
        ),
        "export --opset 99": (
            [*export, "--format", "onnx", "--opset", "99"],
            "--opset 99: the installed exporter writes ONNX opsets 18 to ",
        ),
        "export --format torchscript --opset": (
            [*export, "--format", "torchscript", "--opset", "18"],
            "--opset 18 applies to --format onnx only; drop it for --format torchscript",
        ),
        "predict --region-crs without a region": (
            [*predict, "--region-crs", "EPSG:26918"],
            "--region-crs EPSG:26918 applies to --region or --bbox coordinates",
        ),
        "predict --stac-asset without STAC inputs": (
            [*predict, "--stac-asset", "visual"],
            "--stac-asset visual applies only to STAC inputs",
        ),
        "predict --stac-pick without STAC inputs": (
            [*predict, "--stac-pick", "all"],
            "--stac-pick all applies only to STAC inputs",
        ),
        "tile --stac-pick without STAC inputs": (
            ["tile", str(i.scene), "--out", str(out / "c.zarr"), "--stac-pick", "oldest"],
            "--stac-pick oldest applies only to STAC inputs",
        ),
        "predict --device meta": (
            [*predict, "--device", "meta"],
            "--device meta: landcover predicts on cpu, cuda, cuda:N or mps",
        ),
        "predict --device cpu:2": (
            [*predict, "--device", "cpu:2"],
            "--device cpu:2: landcover predicts on cpu, cuda, cuda:N or mps",
        ),
        "evaluate --overwrite without --out": (
            ["evaluate", str(i.prediction), "--truth", str(i.truth), "--overwrite"],
            "--overwrite replaces the report of --out DIR, and no --out was given",
        ),
    }


IGNORED = [
    "export --opset 7",
    "export --opset 99",
    "export --format torchscript --opset",
    "predict --region-crs without a region",
    "predict --stac-asset without STAC inputs",
    "predict --stac-pick without STAC inputs",
    "tile --stac-pick without STAC inputs",
    "predict --device meta",
    "predict --device cpu:2",
    "evaluate --overwrite without --out",
]


@pytest.mark.parametrize("case", IGNORED)
def test_an_option_value_the_command_would_ignore_or_change_is_refused(
    case: str, inputs: Inputs, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    args, message = _ignored_values(inputs, out)[case]
    line = one_error_line(invoke(*args))
    assert message in line, line
    assert not out.exists()
