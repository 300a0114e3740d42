"""The run vocabulary every command and engine speaks: options and their defaults, the one
parser, the inputs refused before anything starts, the environment the tool reads, size
limits, workloads."""
