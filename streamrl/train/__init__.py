"""The train stage: trainer engines (hf, torchtitan), the rank step, checkpoints, metrics (workers/trainer.py runs it)."""
