"""Models: Hugging Face loading helpers, the offline tiny model, random Qwen3 shapes, torchtitan model specs."""
