"""``python -m dapo_cli`` = the ``dapo`` command."""

from dapo_cli.cli import main

main()
