"""Scaling report: every number is recomputed here from the synthetic metrics it was fed."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cluster.vmsizes import GBIT, IB_EDR
from landcover.cli.app import main
from landcover.errors import OutputExistsError, ReportError
from landcover.scaling.projection import DEFAULT_NETWORK, parse_network
from landcover.scaling.report import (
    build_scaling_report,
    report_markdown,
    scaling_table,
    write_scaling_report,
)
from landcover.scaling.runs import load_runs
from tests.landcover.scaling.runfiles import BATCH, CPU, only, power_law_runs, steps_for, write_run

GPU = "cuda: NVIDIA H100 80GB HBM3"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def ring_by_hand(payload: float, n: int, gbit: float, latency_s: float) -> float:
    if n == 1:
        return 0.0
    return 2 * (n - 1) * latency_s + 2 * (n - 1) / n * payload / (gbit * GBIT)


# --- the numbers -----------------------------------------------------------------------------


def test_exponent_speedup_efficiency_and_projection_error_from_the_metrics(tmp_path: Path) -> None:
    workers = [1, 2, 4, 8, 16]
    power_law_runs(tmp_path, workers)
    network = parse_network("25gbit:30us")
    report = build_scaling_report(load_runs([tmp_path]), project_to=(64, 148), network=network)
    (curve,) = report.curves
    assert curve.fit is not None
    assert curve.fit.exponent == pytest.approx(-0.8, abs=1e-9)
    assert curve.fit.points == 5
    for row in curve.rows:
        n = row.run.workers
        assert row.run.epoch_time_s == pytest.approx(100 * n**-0.8 * 1.01)  # median of t, 1.02 t
        assert row.speedup == pytest.approx(n**0.8)
        assert row.ideal_speedup == n
        assert row.efficiency == pytest.approx(n**-0.2)
    # the compute fit and the projection's errors, worked out from the formulas in the report
    t = {n: 100 * n**-0.8 * 1.01 for n in workers}
    comm = {n: ring_by_hand(4e6, n, 25, 30e-6) for n in [*workers, 64, 148]}
    a = {n: steps_for(n) * BATCH / t[n] for n in workers}
    k = {n: steps_for(n) * comm[n] / t[n] for n in workers}
    c = sum(a[n] * (1 - k[n]) for n in workers) / sum(a[n] ** 2 for n in workers)
    projection = curve.projection
    assert projection is not None
    assert projection.model.compute_per_sample_s == pytest.approx(c, rel=1e-9)
    assert projection.model.payload_bytes == 4e6
    by_workers = {p.workers: p for p in projection.points}
    # 148 workers would get 6 of the 1003 chips each, less than a batch of 8: refused
    assert sorted(by_workers) == [1, 2, 4, 8, 16, 64]
    assert projection.refused is not None and "not projected to 148 workers" in projection.refused
    for n in workers:
        projected = steps_for(n) * (BATCH * c + comm[n])
        assert by_workers[n].epoch_time_s == pytest.approx(projected, rel=1e-9)
        assert by_workers[n].relative_error == pytest.approx((projected - t[n]) / t[n], rel=1e-9)
    assert projection.max_abs_error == pytest.approx(
        max(abs(steps_for(n) * (BATCH * c + comm[n]) - t[n]) / t[n] for n in workers)
    )
    for n in (64,):
        assert by_workers[n].relative_error is None
        projected = steps_for(n) * (BATCH * c + comm[n])
        assert by_workers[n].epoch_time_s == pytest.approx(projected, rel=1e-9)
        # samples trained per second against 1 worker's (1 step of 64 × 8 samples vs 125 × 8)
        baseline_rate = 1 / c
        rate = steps_for(n) * n * BATCH / projected
        assert by_workers[n].speedup == pytest.approx(rate / baseline_rate, rel=1e-9)
        assert by_workers[n].efficiency == pytest.approx(rate / baseline_rate / n, rel=1e-9)


def test_runs_made_by_the_ring_model_are_projected_without_error(tmp_path: Path) -> None:
    compute_per_sample_s, payload = 0.02, 3e7
    for n in (1, 2, 3, 4):
        t = steps_for(n) * (BATCH * compute_per_sample_s + ring_by_hand(payload, n, 10, 50e-6))
        write_run(tmp_path, f"w{n}", workers=n, epoch_times=[t * 2, t], comm_bytes_per_step=payload)
    report = build_scaling_report(
        load_runs([tmp_path]), project_to=(125,), network=parse_network("10gbit:50us")
    )
    projection = report.curves[0].projection
    assert projection is not None
    assert projection.model.compute_per_sample_s == pytest.approx(compute_per_sample_s)
    assert projection.max_abs_error == pytest.approx(0.0, abs=1e-9)
    at_125 = projection.points[-1]  # the most workers 1003 chips give a batch of 8 each
    expected = steps_for(125) * (BATCH * 0.02 + 248 * 50e-6 + 248 / 125 * payload / 1.25e9)
    assert (at_125.workers, at_125.steps) == (125, 1)
    assert at_125.epoch_time_s == pytest.approx(expected)


def test_network_comes_from_the_runs_vm_size_unless_overridden(tmp_path: Path) -> None:
    run_json = {"cores": 24, "cluster": {"vmSize": "Standard_NC24rs_v3", "targetNodeCount": 2}}
    power_law_runs(tmp_path / "azure", [1, 2], run_json=run_json)
    power_law_runs(tmp_path / "plain", [1, 2], device=GPU)
    runs = load_runs([tmp_path / "azure", tmp_path / "plain"])
    report = build_scaling_report(runs)
    by_device = {c.key.device: c.projection for c in report.curves}
    azure, plain = by_device[CPU], by_device[GPU]
    assert azure is not None and plain is not None
    assert azure.model.network == IB_EDR
    assert "Standard_NC24rs_v3" in azure.network_source
    assert plain.model.network == DEFAULT_NETWORK
    assert plain.network_source.startswith("default")
    overridden = build_scaling_report(runs, network=parse_network("infiniband-hdr-200g"))
    assert {c.projection.model.network.name for c in overridden.curves if c.projection} == {
        "infiniband-hdr-200g"
    }


def test_devices_are_never_mixed_in_one_curve(tmp_path: Path) -> None:
    power_law_runs(tmp_path / "cpu", [1, 2, 4], exponent=-0.8)
    power_law_runs(tmp_path / "gpu", [1, 2, 4], scale=10.0, exponent=-0.5, device=GPU)
    report = build_scaling_report(load_runs([tmp_path / "gpu", tmp_path / "cpu"]))
    assert report.devices == (CPU, GPU)
    exponents = {}
    for curve in report.curves:
        assert {r.run.device for r in curve.rows} == {curve.key.device}
        assert curve.fit is not None
        exponents[curve.key.device] = curve.fit.exponent
        assert curve.rows[0].speedup == 1.0  # each device against its own 1-worker run
    assert exponents[CPU] == pytest.approx(-0.8)
    assert exponents[GPU] == pytest.approx(-0.5)


def test_one_curve_per_compression_and_block_momentum_mode(tmp_path: Path) -> None:
    power_law_runs(tmp_path / "none", [1, 2, 4], exponent=-0.6)
    power_law_runs(
        tmp_path / "psgd",
        [1, 2, 4],
        exponent=-0.9,
        compression="powersgd:2",
        comm_bytes_per_step=1e5,
    )
    power_law_runs(tmp_path / "bmuf", [1, 2, 4], exponent=-0.95, block_momentum=True)
    report = build_scaling_report(load_runs([tmp_path / n for n in ("none", "psgd", "bmuf")]))
    curves = {c.label: c for c in report.curves}
    assert set(curves) == {"none", "powersgd:2", "none + block momentum"}
    expected = {"none": -0.6, "powersgd:2": -0.9, "none + block momentum": -0.95}
    for label, curve in curves.items():
        assert curve.fit is not None and curve.fit.exponent == pytest.approx(expected[label])
        assert len(curve.rows) == 3
    psgd = curves["powersgd:2"].projection
    assert psgd is not None and psgd.model.payload_bytes == 1e5
    rows = scaling_table(load_runs([tmp_path / "psgd", tmp_path / "none"]))
    order = [(r.run.compression, r.run.workers) for r in rows]
    assert order == [(c, n) for c in ("none", "powersgd:2") for n in (1, 2, 4)]


# --- what is comparable ----------------------------------------------------------------------


def test_runs_of_different_stores_are_separate_curves(tmp_path: Path) -> None:
    # the report: a 1-worker run on a store 20x smaller joined the big store's curve
    for name, scale in (("big", 100.0), ("small", 5.0)):
        power_law_runs(
            tmp_path / name, [1, 2], scale=scale, run_json={"store": {"url": f"/d/{name}.zarr"}}
        )
    report = build_scaling_report(load_runs([tmp_path / "big", tmp_path / "small"]))
    curves = {c.label: c for c in report.curves}
    assert set(curves) == {"none · store big.zarr", "none · store small.zarr"}
    for curve in report.curves:
        assert len({r.run.store for r in curve.rows}) == 1
        assert [r.speedup for r in curve.rows] == pytest.approx([1.0, 2**0.8])
        assert max(r.efficiency for r in curve.rows) <= 1.0


# a pair of runs (1 and 2 workers) that differ in one thing: their metrics.jsonl overrides
# and their run.json
_DIFFERENT_RESOURCES: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any] | None]]] = {
    "threads": ([{"threads_per_worker": 1}, {"threads_per_worker": 2}], [None, None]),
    "chip size": (
        [{}, {}],
        [{"store": {"url": "c.zarr", "summary": {"chip_size": s}}} for s in (64, 256)],
    ),
    "amp": ([{}, {}], [{"amp": True}, {"amp": False}]),
    "vm size": ([{}, {}], [{"cluster": {"vmSize": v}} for v in ("Standard_D4s_v3", "Standard_F8")]),
    "store content": ([{}, {}], [{"store": {"url": "c.zarr", "digest": d}} for d in "ab"]),
    "batch": ([{"batch_size": 8}, {"batch_size": 16}], [None, None]),
    "model": ([{"model": "small_unet"}, {"model": "unet_resnet18"}], [None, None]),
    "device": ([{"device": CPU}, {"device": GPU}], [None, None]),
}


@pytest.mark.parametrize("resource", list(_DIFFERENT_RESOURCES))
def test_runs_that_differ_in_per_worker_resources_are_never_one_curve(
    tmp_path: Path, resource: str
) -> None:
    # the report: a 1-worker run with 2 threads and a 2-worker run with 1 thread
    # joined one curve, efficiency 23 %
    overrides, run_jsons = _DIFFERENT_RESOURCES[resource]
    for n, extra, run_json in zip((1, 2), overrides, run_jsons, strict=True):
        write_run(
            tmp_path, f"w{n}", workers=n, epoch_times=[30.0, 10.0], run_json=run_json, **extra
        )
    report = build_scaling_report(load_runs([tmp_path]))
    assert sorted(len(c.rows) for c in report.curves) == [1, 1]
    assert all(r.speedup == 1.0 for c in report.curves for r in c.rows)
    labels = [(c.key.device, c.label) for c in report.curves]
    assert len(set(labels)) == len(labels)  # told apart where a device has both
    if resource not in ("batch", "model", "device"):
        (note,) = [n for n in report.notes if "separate curves" in n]
        assert "differ in" in note and "per-worker resources" in note


def test_stores_that_share_a_name_are_told_apart_by_their_url(tmp_path: Path) -> None:
    for name in ("a", "b"):
        power_law_runs(tmp_path / name, [1], run_json={"store": {"url": f"/{name}/chips.zarr"}})
    report = build_scaling_report(load_runs([tmp_path / "a", tmp_path / "b"]))
    assert sorted(c.label for c in report.curves) == [
        "none · store /a/chips.zarr",
        "none · store /b/chips.zarr",
    ]


def test_an_incomplete_run_is_marked_and_left_out_of_the_fit(tmp_path: Path) -> None:
    planned = {"config": {"epochs": 3}}
    power_law_runs(tmp_path, [1, 2, 4], run_json=planned)
    # killed at epoch 2 of 30: one fast epoch, not a measurement of the curve
    write_run(
        tmp_path, "w8", workers=8, epoch_times=[30.0, 1.0], run_json={"config": {"epochs": 30}}
    )
    report = build_scaling_report(load_runs([tmp_path]))
    (curve,) = report.curves
    assert [r.run.workers for r in curve.rows] == [1, 2, 4, 8]
    assert [r.run.workers for r in curve.fit_rows] == [1, 2, 4]
    assert curve.fit is not None and curve.fit.exponent == pytest.approx(-0.8)
    assert curve.projection is not None
    assert {p.workers for p in curve.projection.points if p.measured_epoch_time_s} == {1, 2, 4}
    (note,) = [n for n in report.notes if "incomplete" in n]
    assert f"{tmp_path / 'w8'} (epoch 2 of 30 (incomplete))" in note
    markdown = report_markdown(report)
    (w8_row,) = [line for line in markdown.splitlines() if "| 2 of 30 (incomplete) |" in line]
    assert "| - | - |" in w8_row  # no speed-up or efficiency from two epochs of a killed run
    assert "| 3 of 3 |" in markdown


def test_an_incomplete_smallest_run_is_not_the_baseline(tmp_path: Path) -> None:
    power_law_runs(tmp_path, [2, 4], run_json={"config": {"epochs": 3}})
    write_run(
        tmp_path, "w1", workers=1, epoch_times=[30.0, 1.0], run_json={"config": {"epochs": 9}}
    )
    (curve,) = build_scaling_report(load_runs([tmp_path])).curves
    assert curve.baseline_workers == 2
    assert [(r.run.workers, r.ideal_speedup) for r in curve.rows] == [(1, 0.5), (2, 1), (4, 2)]


def test_speedup_and_efficiency_compare_samples_per_second(tmp_path: Path) -> None:
    # 1 worker trains 1000 samples an epoch, 8 workers only 960 (full batches of 120-chip
    # shards): the epoch-time ratio (8.0) overstates the speed-up, samples per second do not
    write_run(tmp_path, "w1", workers=1, epoch_times=[80.0, 80.0], samples_per_s=1000 / 80.0)
    write_run(tmp_path, "w8", workers=8, epoch_times=[10.0, 10.0], samples_per_s=960 / 10.0)
    (curve,) = build_scaling_report(load_runs([tmp_path])).curves
    w1, w8 = curve.rows
    assert (w1.speedup, w1.efficiency) == (1.0, 1.0)
    assert w8.speedup == pytest.approx(96 / 12.5)
    assert w8.efficiency == pytest.approx(96 / 12.5 / 8)


@pytest.mark.parametrize("counts", [(2, 2), (2, 2, 4, 4)])
def test_repeated_runs_at_one_worker_count_share_its_speedup(
    tmp_path: Path, counts: tuple[int, ...]
) -> None:
    # repeats at a count: one faster than the median read as over 100 % efficiency
    for i, n in enumerate(counts):
        rate = n * 10.0 * (1.1 if i % 2 else 0.9)
        write_run(tmp_path, f"r{i}", workers=n, epoch_times=[10.0, 10.0], samples_per_s=rate)
    (curve,) = build_scaling_report(load_runs([tmp_path])).curves
    assert max(r.efficiency for r in curve.rows) == pytest.approx(1.0)
    for n in set(counts):
        assert len({r.speedup for r in curve.rows if r.run.workers == n}) == 1


# --- oversubscription ------------------------------------------------------------------------


def test_sweep_json_marks_oversubscribed_runs_and_the_fit_leaves_them_out(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    power_law_runs(sweep, [1, 2])
    write_run(sweep, "w4", workers=4, epoch_times=[90.0, 80.0])  # contention: slower than w2
    entries = [
        {"workers": n, "run_dir": f"w{n}", "oversubscribed": n > 2, "cores": 2} for n in (1, 2, 4)
    ]
    (sweep / "sweep.json").write_text(json.dumps({"runs": entries}))
    runs = load_runs([sweep])
    marks = [(r.workers, r.oversubscribed, r.cores) for r in sorted(runs, key=lambda r: r.workers)]
    assert marks == [(1, False, 2), (2, False, 2), (4, True, 2)]
    assert only(runs, 4).oversubscribed_source == "sweep.json"
    (curve,) = build_scaling_report(runs).curves
    assert [r.run.workers for r in curve.rows] == [1, 2, 4]
    assert [r.run.workers for r in curve.fit_rows] == [1, 2]
    assert curve.fit is not None and curve.fit.exponent == pytest.approx(-0.8)


# --- the files -------------------------------------------------------------------------------


@pytest.mark.slow  # six figures: about 5 s
def test_report_files_are_complete_and_the_html_is_self_contained(tmp_path: Path) -> None:
    power_law_runs(tmp_path / "cpu", [1, 2, 4])
    power_law_runs(tmp_path / "gpu", [1, 3], device=GPU)
    runs = load_runs([tmp_path / "cpu", tmp_path / "gpu"])
    out = tmp_path / "out"
    paths = write_scaling_report(runs, out, project_to=(8, 148))
    assert len(paths.images) == 4  # measured + projected, per device (figures: test_plots.py)
    for image in paths.images:
        assert image.read_bytes().startswith(PNG_SIGNATURE)
    page = paths.html.read_text()
    sources = re.findall(r'<img[^>]*\ssrc="([^"]*)"', page)
    assert len(sources) == 4
    for source in sources:
        assert source.startswith("data:image/png;base64,")
        assert base64.b64decode(source.split(",", 1)[1]).startswith(PNG_SIGNATURE)
    assert not re.search(r"https?://|<link|<script", page)
    assert "PROJECTED" in page and "-0.800" in page
    markdown = paths.markdown.read_text()
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    assert sorted(linked) == sorted(p.name for p in paths.images)
    assert "first left out" in markdown and "PROJECTED" in markdown
    assert "| 8 (projected) | 15 |" in markdown
    assert "Not projected to 148 workers: the store" in markdown

    with pytest.raises(
        OutputExistsError, match=r"report.md exists; pass --overwrite to replace the scaling report"
    ):
        write_scaling_report(runs, out)
    cpu_only = [r for r in runs if r.device == CPU]
    again = write_scaling_report(cpu_only, out, overwrite=True)
    assert sorted(p.name for p in out.glob("*.png")) == sorted(p.name for p in again.images)
    assert GPU not in again.markdown.read_text()


# --- bad input -------------------------------------------------------------------------------


def test_project_to_must_be_positive(tmp_path: Path) -> None:
    runs = load_runs(power_law_runs(tmp_path, [1]))
    with pytest.raises(ReportError, match=r"--project-to 0: worker counts must be >= 1"):
        build_scaling_report(runs, project_to=(8, 0))


def test_a_single_worker_count_gets_no_fit_but_still_a_projection(tmp_path: Path) -> None:
    (curve,) = build_scaling_report(
        load_runs(power_law_runs(tmp_path, [2])), project_to=(4,)
    ).curves
    assert curve.fit is None
    assert curve.projection is not None
    assert curve.projection.max_abs_error == pytest.approx(0.0, abs=1e-12)


# --- CLI -------------------------------------------------------------------------------------


def test_cli_prints_the_table_and_where_the_files_are(tmp_path: Path) -> None:
    power_law_runs(tmp_path / "sweep", [1, 2, 4])
    out = tmp_path / "report"
    args = ["report", "scaling", str(tmp_path / "sweep"), "--out", str(out)]
    result = CliRunner().invoke(
        main, [*args, "--project-to", "8,64", "--network", "infiniband-edr-100g"]
    )
    assert result.exit_code == 0, result.output
    assert (
        "| device | mode | workers | nodes | threads/worker | cores | epoch time (s) |"
        in result.stdout
    )
    assert "| 64 (projected) |" in result.stdout
    assert "infiniband-edr-100g (100 Gbit/s, 1.5 µs latency) [--network]" in result.stdout
    assert f"report: {out / 'report.html'}" in result.stdout
    assert f"markdown: {out / 'report.md'}" in result.stdout
    assert (out / "report.html").is_file()

    again = CliRunner().invoke(main, args)
    assert again.exit_code == 2
    assert "report.md exists; pass --overwrite" in again.stderr
    assert CliRunner().invoke(main, [*args, "--overwrite"]).exit_code == 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--network", "fast"], "error: --network 'fast': not a network name, a VM size"),
        (["--project-to", "8,x"], "'x' is not an integer; give e.g. 8,16,64,148"),
        (["--project-to", "8,0"], "0 workers: worker counts must be >= 1"),
    ],
)
def test_cli_rejects_bad_options(tmp_path: Path, extra: list[str], message: str) -> None:
    power_law_runs(tmp_path / "sweep", [1, 2])
    result = CliRunner().invoke(
        main, ["report", "scaling", str(tmp_path / "sweep"), "--out", str(tmp_path / "o"), *extra]
    )
    assert result.exit_code == 2
    assert message in result.stderr
    assert not (tmp_path / "o").exists()


def test_cli_names_a_directory_without_metrics(tmp_path: Path) -> None:
    (tmp_path / "nothing").mkdir()
    result = CliRunner().invoke(
        main, ["report", "scaling", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {tmp_path / 'nothing'}: no metrics.jsonl in it nor in any subdirectory; pass run "
        "directories written by `landcover train --out` (or a sweep directory holding them)\n"
    )


def test_efficiency_is_from_equal_work_when_sample_counts_differ(tmp_path: Path) -> None:
    # 1003 chips in batches of 8: 1 worker trains 125 batches (1000 samples), 8 workers 15
    # each (960). At a perfect 1 ms per sample per worker the 8-worker epoch is 125/15 = 8.3x
    # shorter: 104 % by epoch times, 100 % by samples trained per second.
    for n in (1, 8):
        t = steps_for(n) * BATCH * 0.001
        write_run(
            tmp_path, f"w{n}", workers=n, epoch_times=[t, t],
            samples_per_s=steps_for(n) * n * BATCH / t, comm_bytes_per_step=0.0,
        )  # fmt: skip
    runs = load_runs([tmp_path])
    assert only(runs, 1).epoch_time_s / only(runs, 8).epoch_time_s > 8
    rows = {row.run.workers: row for row in scaling_table(runs)}
    assert rows[8].efficiency == pytest.approx(1.0)
    report = build_scaling_report(runs, project_to=(8,))
    (curve,) = report.curves
    assert curve.projection is not None
    assert all(p.efficiency <= 1 + 1e-9 for p in curve.projection.points)
