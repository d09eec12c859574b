"""The cost stage."""
