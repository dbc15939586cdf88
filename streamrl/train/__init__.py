"""The train stage: trainer engines (hf, torchtitan), the rank step, log-probs, checkpoints, metrics (workers/trainer.py runs it)."""
