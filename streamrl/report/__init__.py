"""Reading a run's outputs: plots."""
