"""`streamrl eval RUN_DIR [--step N]`: a run's checkpoint evaluated alone on the run's eval task, with
the metrics of its eval rounds (pass@k, mean@n, maj@n); samples and metrics in RUN_DIR/eval/step-N/.

    streamrl eval runs/tiny-20261207-120000                        # the newest checkpoint
    streamrl eval runs/tiny-20261207-120000 --step 0               # the base model, for comparison
    streamrl eval runs/tiny-20261207-120000 --set eval.samples=16 --set eval.num_prompts=64

The library function is streamrl/launch/evaluate.py's `evaluate` (also `streamrl.eval.evaluate`).
"""

from __future__ import annotations

NAME = "eval"
HELP = "evaluate a run's checkpoint alone: pass@k, mean@n, maj@n on its eval task, samples written"
DESCRIPTION = (
    "Load the weights of step N of RUN_DIR (default: the newest checkpoint; 0: the base model), generate "
    "the run's eval task (its `eval` section: eval.task or the training task, eval.num_prompts x "
    "eval.samples at eval.temperature) with one vLLM engine in this process, score it with the run's "
    "reward.fn, print the metrics eval rounds log (pass@k, mean@n, maj@n) and write metrics.json and "
    "samples.jsonl to RUN_DIR/eval/step-N (`streamrl samples RUN_DIR/eval/step-N` prints the samples). "
    "No broker, no roles."
)


def add_arguments(p) -> None:
    from streamrl.config.args import add_set_arg

    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (holds config.yaml and checkpoints/)")
    p.add_argument("--step", type=int, help="checkpoint step to evaluate (default: the newest; 0: the base model)")
    add_set_arg(p, example="eval.samples=16", what="a value of the run's config for this evaluation")
    p.add_argument("--out", help="where metrics.json and samples.jsonl go (default: RUN_DIR/eval/step-N)")


def run(args) -> int:
    import os
    import warnings

    from streamrl.launch.evaluate import evaluate

    # vLLM's INFO lines (engine config, KV cache, shutdown) would bury the few lines this command prints;
    # set VLLM_LOGGING_LEVEL=INFO to see them.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # vLLM's own use of deprecated torch names (its Triton dispatcher): nothing a user can act on.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")

    result = evaluate(args.run_dir, args.step, args.overrides, args.out, say=lambda m: print(m, flush=True))
    m = result.metrics
    print(
        f"step {result.step}: {result.headline()} | correct {m['eval/correct_frac']:.3f} | "
        f"{m['eval/completion_len_mean']:.1f} tokens/completion | {result.seconds:.1f}s",
        flush=True,
    )
    if m["eval/reward_errors"]:
        print(f"warning: the reward function failed on {m['eval/reward_errors']} completions (`error` in the samples)")
    print(f"samples: {result.samples_path}  (streamrl samples {result.out_dir})", flush=True)
    return 0
