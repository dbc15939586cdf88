"""The annotate stage: the annotator loop, reward functions, the SDK for external producers, the judge's template and score parsing (workers/reward.py, workers/reference.py, workers/judge.py)."""
