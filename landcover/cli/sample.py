"""`landcover sample`: a stratified random sample of a land-cover map for labelling
(landcover.evaluation.sampling), written as GeoPackage or CSV points with an empty
`reference` column (landcover.evaluation.referencesample)."""

from __future__ import annotations

import logging

import click

from landcover.errors import EvaluationError
from landcover.evaluation.sampling import DEFAULT_MIN_PER_CLASS
from landcover.options import out_url_option, overwrite_option

logger = logging.getLogger(__name__)


def _per_class(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[int, int]:
    counts: dict[int, int] = {}
    for text in values:
        code, sep, n = text.partition("=")
        if not sep or not code.strip().isdigit() or not n.strip().lstrip("-").isdigit():
            raise click.BadParameter(f"{text!r}: write CODE=N, e.g. 2=60", ctx, param)
        counts[int(code)] = int(n)
    return counts


@click.command("sample")
@click.argument("maps", nargs=-1, required=True, metavar="MAP [MAP...]")
@out_url_option(
    "The points to write: sample.gpkg (GeoPackage) or sample.csv.", name="out", required=True
)
@click.option(
    "--size",
    type=int,
    default=None,
    help="Points in all, shared by the classes in proportion to their mapped area, each at "
    "least --min-per-class.",
)
@click.option(
    "--min-per-class",
    type=int,
    default=DEFAULT_MIN_PER_CLASS,
    show_default=True,
    help="The fewest points a class gets (all its pixels when it has fewer).",
)
@click.option(
    "--per-class",
    multiple=True,
    callback=_per_class,
    metavar="CODE=N",
    help="Points for class CODE, whatever its area (repeat for several classes); the other "
    "classes share the rest of --size.",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="The same seed, the same points."
)
@overwrite_option
def sample_command(
    maps: tuple[str, ...],
    out: str,
    size: int | None,
    min_per_class: int,
    per_class: dict[int, int],
    seed: int,
    overwrite: bool,
) -> None:
    """Draw a stratified random sample of MAP(s) (COGs, VRTs or tiled product directories of
    one class table), its strata the map's classes (Olofsson et al. 2014), for people to
    label: fill the `reference` column, then `landcover evaluate MAP --reference OUT`."""
    from landcover.evaluation.referencesample import check_sample_suffix, write_sample
    from landcover.evaluation.sampling import SampleConfig, draw_sample
    from landcover.outputs import check_output_file, require_distinct

    suffix = check_sample_suffix(out, option="--out")
    if suffix == ".gpkg":
        try:
            import pyogrio  # type: ignore[import-untyped]  # noqa: F401
        except ImportError:
            raise EvaluationError(
                f"--out {out}: writing GeoPackage needs pyogrio (pip install "
                "'landcover[gpkg]'); or write a .csv"
            ) from None
    require_distinct([("--out", out)], inputs=[("MAP", m) for m in maps])
    check_output_file(out, option="--out", overwrite=overwrite, example="sample.gpkg")
    config = SampleConfig(
        maps=maps, size=size, min_per_class=min_per_class, per_class=per_class, seed=seed
    )
    points = draw_sample(config)
    write_sample(points, out, overwrite=overwrite)
    names = points.class_map.class_names
    spread = ", ".join(f"{names[c]} {int(n)}" for c, n in enumerate(points.sample_sizes) if c and n)
    click.echo(f"wrote {out}: {len(points)} points ({spread}); fill its reference column")
