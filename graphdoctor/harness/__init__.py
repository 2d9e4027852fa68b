"""graphdoctor.harness."""
