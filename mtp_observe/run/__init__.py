"""The run stage."""
