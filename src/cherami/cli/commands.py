"""Client commands of the CLI."""
