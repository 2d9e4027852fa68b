"""Configuration, in one direction: the sources of a run (flags, run file, launch line) are read, resolved
once into a DiffConfig (graphdoctor.config.resolve), and the Megatron settings are built from it.

Nothing here imports the rest of graphdoctor but its leaf modules (errors, inputs, suggest, installed).
"""

from graphdoctor.config.diff_config import (
    CUDA_GRAPH_MODULES,
    DTYPES,
    GRAPH_FIELDS,
    IMPLS,
    RUN_OWNED_FIELDS,
    STARTUP_VARIABLES,
    TRANSFORMER_TWINS,
    DiffConfig,
)
from graphdoctor.config.resolve import diff_config_from
from graphdoctor.config.run_file import MAX_RUN_FILE_BYTES, RUN_FILE_SECTIONS, RunFile, load_run_file

__all__ = ["CUDA_GRAPH_MODULES", "DTYPES", "GRAPH_FIELDS", "IMPLS", "MAX_RUN_FILE_BYTES", "RUN_FILE_SECTIONS",
           "RUN_OWNED_FIELDS", "STARTUP_VARIABLES", "TRANSFORMER_TWINS", "DiffConfig", "RunFile",
           "diff_config_from", "load_run_file"]
