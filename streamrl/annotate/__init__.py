"""The annotate stage: the annotator loop, reward functions, the SDK for external producers (workers/reward.py, workers/reference.py)."""
