"""graphdoctor.compare."""
