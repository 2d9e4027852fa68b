"""Code that runs in the graphdoctor process: starts children (one subprocess runner), reads their
events back (graphdoctor.protocol) and turns failures into diagnoses. Imports neither torch nor
megatron at module level.
"""
