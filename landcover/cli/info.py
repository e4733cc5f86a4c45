"""`landcover info`: describe a chip store (its counts, band statistics, split, sources and
any damage), as text or JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import click

from landcover.cli.tiling import mb
from landcover.options import storage_options_option
from tiling.chipstore.store import StoreSummary, open_store
from tiling.errors import StoreCorruptError
from tiling.runtime.urls import check_storage_options


@click.command("info")
@click.argument("store")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--verify",
    is_flag=True,
    help="Also read every chip and check every checksum (reads the whole store). Without "
    "it, info lists the store's objects to find missing ones.",
)
@storage_options_option
def info_command(
    store: str, as_json: bool, verify: bool, storage_options: Mapping[str, Any]
) -> None:
    """Describe the chip store at STORE (chips, splits, classes, band stats, sources).

    Exits with status 2 when the store is damaged (shard objects missing, or with --verify
    any checksum failing), after describing it.
    """
    check_storage_options([store], storage_options)
    chip_store = open_store(store, storage_options=dict(storage_options))
    summary = chip_store.summary
    stored = chip_store.stored_bytes()
    damage = chip_store.missing_objects()
    corrupt: StoreCorruptError | None = None
    if verify and not damage:
        try:
            chip_store.verify()
        except StoreCorruptError as exc:
            corrupt = exc
            damage = [str(exc).split(": ", 1)[1].split(";", 1)[0]]
    if as_json:
        click.echo(json.dumps(summary_json(store, summary, stored, damage=damage), indent=2))
    else:
        for line in describe_summary(store, summary, stored, damage=damage):
            click.echo(line)
    if corrupt is not None:
        raise corrupt
    if damage:
        raise StoreCorruptError(
            f"{store}: {len(damage)} shard object{'s' if len(damage) > 1 else ''} missing "
            f"({damage[0]}{', ...' if len(damage) > 1 else ''}); the store is damaged, "
            f"re-tile with: landcover tile <the same inputs and options> --out {store} "
            "--overwrite"
        )


def _state(s: StoreSummary, damage: list[str]) -> str:
    if damage:
        return "DAMAGED"
    state = "complete" if s.complete else "incomplete (rerun the tile command to resume)"
    if not s.integrity_checked:
        state += "; integrity not checkable (older format: re-tile with --overwrite)"
    return state


def summary_json(
    url: str, s: StoreSummary, stored_bytes: int, *, damage: list[str] | None = None
) -> dict[str, Any]:
    return {
        "url": url,
        "format_version": s.format_version,
        "complete": s.complete,
        "damaged": list(damage or []),
        "integrity_checked": s.integrity_checked,
        "split_block_m": s.split_block_m,
        "chip_size": s.chip_size,
        "stride": s.stride,
        "shard_size": s.shard_size,
        "bands": list(s.bands),
        "chips": s.num_chips,
        "train": s.num_train,
        "val": s.num_val,
        "val_fraction": s.val_fraction,
        "has_labels": s.has_labels,
        "class_map": s.class_map.name if s.class_map else None,
        "classes": (
            [
                {"code": c.code, "name": c.name, "pixels": s.class_counts[c.code]}
                for c in s.class_map.classes
            ]
            if s.class_map
            else []
        ),
        "band_mean": list(s.band_mean),
        "band_std": list(s.band_std),
        "resolution_m": s.resolution_m,
        "bytes_on_disk": stored_bytes,
        "sources": [
            {
                "id": r.id,
                "path": r.path,
                "shape": list(r.shape),
                "chips": r.chips,
                "train": r.train_chips,
                "val": r.val_chips,
                "resolution_m": r.resolution_m,
            }
            for r in s.sources
        ],
    }


def describe_summary(
    url: str, s: StoreSummary, stored_bytes: int, *, damage: list[str] | None = None
) -> list[str]:
    damage = list(damage or [])
    lines = [
        f"store: {url} (format version {s.format_version}, {_state(s, damage)})",
        f"chips: {s.num_chips} of {s.chip_size} x {s.chip_size} px "
        f"(train {s.num_train}, val {s.num_val}), stride {s.stride}, {s.shard_size} per shard",
        f"bytes on disk: {mb(stored_bytes)} ({mb(s.num_chips * s.chip_bytes)} uncompressed)",
        "bands:  " + "  ".join(f"{b:>7}" for b in s.bands),
        "  mean: " + "  ".join(f"{m:7.2f}" for m in s.band_mean),
        "  std:  " + "  ".join(f"{d:7.2f}" for d in s.band_std),
    ]
    if s.class_map:
        total = sum(s.class_counts) or 1
        lines.append(f"classes ({s.class_map.name}):")
        for c in s.class_map.classes:
            n = s.class_counts[c.code]
            lines.append(f"  {c.code:3d} {c.name:<22} {n:>14,d} px {100 * n / total:6.2f} %")
    else:
        lines.append("labels: none (images-only store)")
    if damage:
        lines.append(f"damaged: {len(damage)} shard objects missing or corrupt:")
        lines.extend(f"  {d}" for d in damage[:10])
        if len(damage) > 10:
            lines.append(f"  ... and {len(damage) - 10} more")
    if s.split_block_m:
        lines.append(
            f"split: ground blocks of {s.split_block_m:g} m, val fraction {s.val_fraction}"
        )
    lines.append(f"sources: {len(s.sources)}")
    for r in s.sources[:20]:
        lines.append(f"  {r.id:4d} {r.path}  {r.shape[0]} x {r.shape[1]} px, {r.chips} chips")
    if len(s.sources) > 20:
        lines.append(f"  ... and {len(s.sources) - 20} more (--json lists all)")
    return lines
