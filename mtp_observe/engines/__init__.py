"""The engines stage."""
