"""An external reward producer in Python: a toy "length judge" (completion tokens / 16), the same
score as examples/node/producer.mjs, served with the streamrl SDK.

    cd examples/python
    streamrl reward --fn length_judge:judge --run tiny --broker redis://producer-tiny-judge:PW@127.0.0.1:PORT/0

Replace the body with a call to your judge model or sandbox; an `async def` is awaited (up to
`concurrency` batches at once), a plain `def` runs in a thread. Raise, or return NaN, to report a
rollout as failed: it gets an `error` annotation and the trainer applies the key's on_timeout policy.
"""

from streamrl.annotate.sdk import producer
from streamrl.core.messages import Rollout

MAX_TOKENS = 16


@producer(key="judge", batch_size=32, concurrency=2)
async def judge(rollouts: list[Rollout]) -> list[float]:
    return [min(1.0, len(r.completion_ids) / MAX_TOKENS) for r in rollouts]
