"""The sessions stage."""
