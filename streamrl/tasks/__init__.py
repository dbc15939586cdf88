"""The tasks themselves: each task's items and how its answers are read and scored, as pure functions.

The feeder (streamrl/feed/) admits their items, the reward (streamrl/annotate/rewards.py) and the env
(streamrl/envs/base.py) score with them, evaluation votes on their answers and SFT writes their targets,
so they sit below every stage instead of inside one of them.
"""
