"""Train the tiny CPU task from Python, with a reward function defined in this script (docs/python-api.md).

    python examples/python_api.py                                  # 40 steps: a few minutes on 2 CPU cores
    python examples/python_api.py --run-dir runs/api trainer.steps=10 rollout.max_staleness=2

Every role is its own process: the reward workers import `score` from this file by its path, which runs
the file's top level again in them (as a module, not as `__main__`). So `score` lives at module level,
and the job starts only under `if __name__ == "__main__":`.
"""

from __future__ import annotations

import argparse

import streamrl


def score(prompt: str, completion: str, meta: dict) -> float:
    """The charclass task's reward, written out: the fraction of the completion's first meta["length"]
    characters that belong to the class the prompt names (its characters are meta["chars"])."""
    head = completion[: meta["length"]]
    return sum(c in meta["chars"] for c in head) / meta["length"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", help="where the job writes (default: a new folder under runs/)")
    p.add_argument("overrides", nargs="*", metavar="SECTION.FIELD=VALUE", help="as `streamrl up --set`")
    args = p.parse_args()

    # The tiny CPU preset (configs/tiny-cpu.yaml) with our reward function and 40 steps; then the
    # command line's overrides. Validated like `streamrl up --config ... --set ...`: a typo fails here.
    config = streamrl.load_config("tiny-cpu", args.overrides, reward={"fn": score}, trainer={"steps": 40})
    print(f"reward.fn = {config.reward.fn}")  # what the roles import: this file's path and `score`

    job = streamrl.start(config, run_dir=args.run_dir)  # prints the console lines `streamrl up` prints
    best = 0.0
    for row in job.rows():  # each trainer step's metrics as it comes
        best = max(best, row["reward_mean"])
    result = job.wait()

    rows = result.metrics
    first = sum(r["reward_mean"] for r in rows[:10]) / len(rows[:10])
    last = sum(r["reward_mean"] for r in rows[-10:]) / len(rows[-10:])
    s = result.summary
    print(
        f"python api: {result.steps} steps in {result.run_dir}; mean reward {first:.3f} (first 10) -> {last:.3f} (last 10), best step {best:.3f}"
    )
    print(
        f"python api: groups admitted {s['admitted']} = trained {s['trained']} + other outcomes; invariant holds: {s['invariant_holds']}"
    )
    print(f"python api: model {result.model_dir}")


if __name__ == "__main__":
    main()
