"""Judge role: score each rollout with a judge model and publish its number under judge.key.

    streamrl worker judge --config configs/tiny-judge-cpu.yaml --broker redis://... --run tiny-judge

Reads `rollouts` with the consumer group "judge" in batches of judge.batch_size (workers of this role
share the load; a killed judge's pending rollouts are taken over like every annotator's), renders
judge.template for each, sends the batch to its own vLLM engine on judge.model.path, parses each
output with judge.score, writes Annotation(key=judge.key), then acks (the annotator loop,
streamrl/annotate/annotator.py). An output that does not parse, or a prompt that does not render or
fit, is that rollout's annotation `error` and a dead-letter record (judge.on_error decides what the
assembler does with it), never the worker's crash. Eval rollouts are skipped (they are never trained).
"""

from __future__ import annotations

import itertools

from streamrl.annotate.annotator import Annotator
from streamrl.annotate.judge import JudgeError, parse_score, render
from streamrl.core.errors import FatalError
from streamrl.core.messages import Rollout, is_eval_group
from streamrl.generate.judge_engine import JudgeEngine, RequestFailed

GROUP = "judge"


class JudgeWorker(Annotator):
    role = "judge"
    group = GROUP

    async def start(self) -> None:
        if self.cfg.judge is None:  # e.g. `streamrl scale judge=1` on a job whose config has no judge
            raise FatalError('this job\'s config has no `judge:` section; add one (docs/rewards.md, "LLM judge")')
        self.key = self.cfg.judge.key
        self.engine = JudgeEngine(self.cfg)
        await self.engine.start()
        self.batches = itertools.count()
        for stream in self.keys.rollout_streams:  # every partition (rollout.partitions)
            await self.broker.ensure_group(stream, GROUP)

    def batch_size(self) -> int:
        return self.cfg.judge.batch_size

    def skip(self, rollout: Rollout) -> bool:
        return is_eval_group(rollout.group_id)

    def _prompts(self, rollouts: list[Rollout]) -> list[list[int] | JudgeError]:
        out: list[list[int] | JudgeError] = []
        for r in rollouts:
            try:
                out.append(self.engine.prompt_ids(render(self.cfg.judge.template, r.prompt_text, r.text, r.meta)))
            except JudgeError as exc:
                out.append(exc)
        return out

    async def annotate(self, rollouts: list[Rollout]) -> list[tuple]:
        prompts = await self.calls.run(self._prompts, rollouts)  # tokenizing a batch: off the event loop
        todo = [(r.rollout_id, p) for r, p in zip(rollouts, prompts) if not isinstance(p, JudgeError)]
        texts = iter(await self.engine.judge(todo, f"{self.worker_id}:{next(self.batches)}"))
        out = []
        for p in prompts:
            got = p if isinstance(p, JudgeError) else next(texts)
            reply = got if isinstance(got, str) else ""  # the judge's text, kept in samples.jsonl
            if not isinstance(got, (JudgeError, RequestFailed)):
                try:
                    out.append((parse_score(self.cfg.judge.score, got), "", {}, reply))
                    continue
                except JudgeError as exc:
                    got = exc
            self.count("judge_errors")
            out.append((0.0, str(got), {}, reply))
        return out

    async def close(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
        await super().close()
