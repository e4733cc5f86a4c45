"""Error classes of the landcover package."""

from __future__ import annotations

# The first line of a library's error, quoted in a one-line error (tiling's, re-exported).
from tiling.errors import reason as reason


class LandcoverError(ValueError):
    """Base class: bad input to training, prediction, evaluation or reporting."""


class ModelFileError(LandcoverError):
    """A file that is not a landcover model, or one that would need unpickling code."""


class UnknownModelError(LandcoverError, KeyError):
    """A model name that is not in the registry; the message lists `available()`."""

    def __str__(self) -> str:  # KeyError quotes its message; we want the plain line
        return str(self.args[0]) if self.args else ""


class LaunchEnvError(LandcoverError):
    """A launcher environment (RANK, WORLD_SIZE, SLURM_PROCID, ...) that names no valid rank."""


class TrainingError(LandcoverError):
    """A training configuration that cannot run (memory, device, world size, store)."""


class RegionError(LandcoverError):
    """A prediction region that is invalid or does not intersect the images."""


class EvaluationError(LandcoverError):
    """Prediction and truth that cannot be compared."""


class ReportError(LandcoverError):
    """Run directories that hold no usable metrics."""


class PredictionError(LandcoverError):
    """A model and images that cannot be predicted together (bands, classes, device)."""


class OutputExistsError(LandcoverError, FileExistsError):
    """An output file exists and --overwrite was not given."""


class OutputError(LandcoverError):
    """An output that cannot be written where it was asked for: a directory where a file goes,
    a directory that takes no new files, a full disk, or two outputs of one command at one
    path."""


class OutputBusyError(LandcoverError):
    """An output another run is writing now (it holds the output's lock,
    `landcover.outputlock`)."""


class TuneError(LandcoverError):
    """A search space or a study directory that `landcover tune` cannot use."""


class ExportError(LandcoverError):
    """A model that cannot be exported as asked (format, opset, a missing optional library)."""


class ViewError(LandcoverError):
    """A map or imagery that `landcover view` (or a picture of a map) cannot show."""


class ChangeError(LandcoverError):
    """Two maps that cannot be compared for change (class tables, CRS, grids)."""
