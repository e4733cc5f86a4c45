"""Land-cover segmentation: models, distributed training, prediction, evaluation, reports, CLI."""

from landcover.errors import LandcoverError

__version__ = "0.1.0"
__all__ = ["LandcoverError", "__version__"]
