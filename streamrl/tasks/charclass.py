"""The synthetic charclass task (no downloads): the prompt names a character class ("digits:",
"vowels:", "upper:", "lower:") and the reward is the fraction of the first `length` completion
characters that belong to it.

    items = charclass_items(num_prompts, length, seed)     # [{"text": "digits:", "meta": {...}}, ...]
    r = charclass_reward(prompt, completion, item["meta"])

A random tiny model scores low; a model that learned the task scores 1.0, and only if it writes
the full length. Every meta holds only str/int so it travels through msgpack unchanged.
"""

from __future__ import annotations

import random
import string

CHAR_CLASSES: dict[str, str] = {
    "digits": string.digits,
    "vowels": "aeiouAEIOU",
    "upper": string.ascii_uppercase,
    "lower": string.ascii_lowercase,
}
"""Class name -> the characters that score. The prompt is the name followed by ':'."""


def charclass_items(num_prompts: int, length: int, seed: int) -> list[dict]:
    """`num_prompts` prompts cycling through the classes, in a seeded order (balanced)."""
    names = sorted(CHAR_CLASSES)
    items = [
        {
            "text": f"{name}:",
            "meta": {"task": "charclass", "cls": name, "chars": CHAR_CLASSES[name], "length": length},
        }
        for name in (names[i % len(names)] for i in range(num_prompts))
    ]
    random.Random(seed).shuffle(items)
    return items


def charclass_dialog_items(num_prompts: int, length: int, seed: int) -> list[dict]:
    """The multi-turn charclass task: the prompt is only "?"; the env (streamrl.envs.base.CharclassDialog)
    names the class in its first observation and scores the model's second turn against it."""
    return [{"text": "?", "meta": item["meta"]} for item in charclass_items(num_prompts, length, seed)]


def charclass_reward(prompt: str, completion: str, meta: dict) -> float:
    """Fraction of the first meta["length"] characters that are in meta["chars"].

    Missing characters count as misses, so stopping early scores low.
    """
    length = int(meta["length"])
    chars = set(meta["chars"])
    return sum(c in chars for c in completion[:length]) / length
