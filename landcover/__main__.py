"""`python -m landcover ...` is the `landcover` command (the ranks of a tile or predict job
run it this way: `landcover.cli.stagejob`)."""

from landcover.cli.app import main

main(prog_name="landcover")
