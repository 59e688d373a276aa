"""``python -m lmckit``: the command-line tool."""

from lmckit.cli import main

main()
