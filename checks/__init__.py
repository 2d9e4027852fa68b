"""Rule catalogue (installed as graphdoctor.checks)."""
