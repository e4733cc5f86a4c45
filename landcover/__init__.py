"""landcover: aerial imagery to land-cover maps at scale.

The Python API is three calls (`landcover.api`): `tile` images into a chip store, `train` a
model on it, `predict` a map of a region. The subpackages hold one role each:

- `landcover.cli`: the `landcover` command
- `landcover.models`: the model registry, U-Nets, torchvision models, the model file
- `landcover.data`: a worker's shard in RAM, batches, augmentation, `normalise`
- `landcover.training`: `TrainConfig`, the Trainer, schedule, losses, run directory, resume
- `landcover.comm`: gradient compression hooks, the byte meter, block momentum (BMUF)
- `landcover.prediction`: regions, the output grid, blending, the windowed runner, COGs
- `landcover.evaluation`: scores of a map against truth
- `landcover.scaling`: run records, sweeps, projections, plots and the scaling report
- `landcover.demo`: the whole pipeline on generated data

Packages are nouns and the API is verbs, so `landcover.train` (a function) never shadows a
subpackage.
"""

from landcover.api import predict, tile, train
from landcover.errors import LandcoverError
from landcover.version import __version__

__all__ = ["LandcoverError", "__version__", "predict", "tile", "train"]
