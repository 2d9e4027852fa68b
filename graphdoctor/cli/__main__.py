"""`python -m graphdoctor.cli` runs the CLI (used by tests and where the console script is absent)."""

from graphdoctor.cli import main

main()
