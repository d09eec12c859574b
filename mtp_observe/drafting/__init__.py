"""The drafting stage."""
