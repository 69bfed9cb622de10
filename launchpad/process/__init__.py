"""The node-process substrate: how a node process is specified, started and coordinated."""
