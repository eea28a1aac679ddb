"""The builder, export and the command-line interface."""
