"""graphdoctor.launches."""
