"""Click commands of the `landcover` CLI, one module per stage; `landcover.cli` assembles them."""
