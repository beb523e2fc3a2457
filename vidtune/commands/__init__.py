"""The ``vidtune`` commands, one module per group (``vidtune/cli.py`` parses the arguments and dispatches)."""
