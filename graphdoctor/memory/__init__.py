"""graphdoctor.memory."""
