"""Evaluation during training: rounds the feeder issues, the trainer's collector of their scores."""
