"""The process shells: a node (every role in one process, store hosts as children),
a role process of a cluster, and the assembly that wires roles to each other through
their clients. The top of the import graph below the CLI."""
