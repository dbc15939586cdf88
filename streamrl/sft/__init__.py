"""Supervised fine-tuning: data, packing, the SFT step (workers/sft.py runs it)."""
