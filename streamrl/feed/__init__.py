"""The feed stage: tasks and dataset records -> prompt groups (workers/feeder.py runs it)."""
