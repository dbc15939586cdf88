"""A reward function for `reward.fn`: reach a target length, in characters.

The reward worker calls `score(prompt, completion, meta)` once per rollout: `prompt` and
`completion` are decoded text, `meta` is the task item's metadata (charclass: task, cls, chars,
length; gsm8k: task, answer). Run the tiny job with it (the module must be importable by the
reward worker, so its folder goes on PYTHONPATH):

    PYTHONPATH=examples/rewards streamrl up --set reward.fn=length_reward:score
"""

TARGET_CHARS = 32
"""Target length when the task gives none (gsm8k items carry only their answer)."""


def score(prompt: str, completion: str, meta: dict) -> float:
    """Fraction of the target length the completion reaches, capped at 1.0."""
    target = int(meta.get("length", TARGET_CHARS))
    return min(len(completion.strip()) / target, 1.0)
