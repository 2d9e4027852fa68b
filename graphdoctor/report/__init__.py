"""graphdoctor.report."""
