"""The scaling report's answer to "should I compress?": where each compression mode beats
plain all-reduce (`none`), as document blocks (`landcover.scaling.document`) from the
crossover arithmetic of `landcover.scaling.crossover`."""

from __future__ import annotations

from landcover.scaling.crossover import (
    CROSSOVER_LINKS,
    MAX_WORKERS,
    break_even_bandwidth,
    mode_pairs,
    payoff_workers,
)
from landcover.scaling.curves import ScalingReport
from landcover.scaling.document import Block, Heading, Paragraph, Table

__all__ = ["payoff_blocks"]

_PAYOFF_NOTE = (
    "Each compression mode against plain all-reduce (`none`) of the same device, store, model "
    "and batch, both PROJECTED by their own models: the mode's own fitted compute per sample "
    "(compression costs compute) and its own measured collectives, over the link named. Step "
    "times are compared (at a given worker count both run the same steps per epoch, so this is "
    "also the ratio of epoch times, whatever the store's size). 'From N': the mode is faster "
    f"from N workers on (up to {MAX_WORKERS} searched); 'N-M only': faster there and slower beyond."
)


def payoff_blocks(report: ScalingReport) -> list[Block]:
    """Where each compression mode beats `none`: by worker count per link, and by link speed
    at each projected worker count (with the epoch-time ratio on the report's network)."""
    pairs = mode_pairs(report.curves)
    if not pairs:
        return []
    links = CROSSOVER_LINKS
    by_link = tuple(
        (
            pair.mode.key.device,
            pair.mode.label,
            *(
                payoff_workers(pair.mode_model, pair.baseline_model, net).describe()
                for net in links
            ),
        )
        for pair in pairs
    )
    by_count: list[tuple[str, ...]] = []
    for pair in pairs:
        network = pair.mode_model.network
        for n in report.project_to:
            if n < 2:
                continue
            ratio = pair.mode_model.step_time_s(n) / pair.baseline_model.with_network(
                network
            ).step_time_s(n)
            even = break_even_bandwidth(
                pair.mode_model, pair.baseline_model, n, latency_s=network.latency_s
            )
            by_count.append(
                (
                    pair.mode.key.device,
                    pair.mode.label,
                    str(n),
                    network.name,
                    f"{ratio:.2f}×",
                    "yes" if ratio < 1 else "no",
                    even.describe(),
                )
            )
    return [
        Heading(2, "Does compression pay off? (PROJECTED against `none`)"),
        Paragraph(_PAYOFF_NOTE),
        Table(
            ("device", "mode", *(f"workers where faster on {net.name}" for net in links)),
            by_link,
        ),
        Table(
            (
                "device",
                "mode",
                "workers",
                "link",
                "epoch time vs none",
                "pays off",
                "pays off at this worker count",
            ),
            tuple(by_count),
        ),
    ]
