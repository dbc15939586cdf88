"""Evaluation: rounds during training (the feeder issues them, the trainer's collector scores them;
rounds.py, collector.py) and a checkpoint evaluated alone (`streamrl eval`; result.py).

    from streamrl.eval import evaluate
    result = evaluate("runs/tiny-20261207-120000", step=40)    # EvalResult: metrics, RUN_DIR/eval/step-40/
"""

from streamrl.eval.result import EvalResult

__all__ = ["EvalResult", "evaluate"]


def __getattr__(name: str):
    # `evaluate` composes an engine, the rewards and the feeder's items (streamrl/launch/evaluate.py):
    # imported on first use only, so the roles that import this folder's rounds never load it.
    if name == "evaluate":
        from streamrl.launch.evaluate import evaluate

        return evaluate
    raise AttributeError(f"module 'streamrl.eval' has no attribute {name!r}")
