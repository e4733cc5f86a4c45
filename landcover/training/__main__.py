"""`python -m landcover.training STORE --out RUN_DIR [options]`: one training worker, as every
launcher (torchrun, SLURM, Azure ML, Kubeflow) starts it."""

from landcover.cli.train import worker_command
from landcover.training.config import WORKER_PROG

if __name__ == "__main__":
    worker_command.main(prog_name=WORKER_PROG)
