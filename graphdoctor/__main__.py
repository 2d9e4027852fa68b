"""`python -m graphdoctor` runs the CLI (also `torchrun --nproc-per-node N -m graphdoctor diff ...`)."""

from graphdoctor.cli import run

run()
