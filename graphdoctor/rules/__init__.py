"""graphdoctor.rules."""
