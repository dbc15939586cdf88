"""Feeder role: dataset -> `prompts`, one entry per prompt group, under the staleness admission bound.

    streamrl worker feeder --config configs/tiny-cpu.yaml --broker redis://... --run tiny

Admits a group only while `admitted - released < (v + max_staleness + 1) * groups_per_step`
(streamrl.core.staleness.admission_budget); stops admitting once the run's steps are covered.
The admitted count lives in the broker and moves in the same atomic script that appends the
prompts (streamrl.core.accounting.admit), so a feeder killed at any instant neither loses nor double
counts a group, and a restarted feeder continues where it stopped.
"""

from __future__ import annotations

import asyncio
import random

from streamrl.config.schema import Config, TaskConfig
from streamrl.core.accounting import admit
from streamrl.core.messages import Prompt, encode
from streamrl.core.staleness import admission_budget
from streamrl.core.worker import Worker
from streamrl.envs import adapters as env_adapters
from streamrl.envs.tools import load_tools
from streamrl.eval.rounds import EvalIssuer
from streamrl.feed.sources import load_task
from streamrl.generate.chat import ChatBridge, chat_items
from streamrl.models.tokenizer import load_tokenizer


def load_items(task: TaskConfig, seed: int, job: Config, tokenizer=None) -> list[dict]:
    """The items of `task` (the training task or eval.task): task.name=env takes the env's first
    observations from its adapter, every other task comes from streamrl.feed.sources."""
    if task.name == "env":
        return env_adapters.prompts(job.env.fn, task.num_prompts, seed)
    return load_task(task, seed, tokenizer, job.generator.max_tokens, job)


def task_items(items: list[dict], tokenizer, cfg: Config) -> list[dict]:
    """The feeder's items under the job's config `cfg`: rendered as chat prompts (with the schemas of
    tools.names) where Config.chat_prompts says so (task.chat_template, tools.chat), unchanged otherwise
    or when the task already rendered its own chat messages (task.fields.messages)."""
    if not cfg.chat_prompts(bool(getattr(tokenizer, "chat_template", None))):
        return items
    schemas = [t.schema() for t in load_tools(cfg.tools.names, cfg.tools.sandbox).values()]
    return chat_items(items, ChatBridge(tokenizer, cfg.tools, schemas))


class FeederWorker(Worker):
    role = "feeder"

    async def start(self) -> None:
        self.tokenizer = load_tokenizer(self.cfg.model.path)
        # The tokenizer renders chat tasks; task.chat_template (or tools.chat) with the model's chat template.
        self.items = load_items(self.cfg.task, self.cfg.run.seed, self.cfg, self.tokenizer)
        self.items = task_items(self.items, self.tokenizer, self.cfg)
        random.Random(self.cfg.run.seed).shuffle(self.items)
        r = self.cfg.rollout
        self.total = self.cfg.trainer.steps * r.groups_per_step
        self.evals = None
        if self.cfg.eval.every_steps:  # eval rounds (streamrl/eval/rounds.py): outside admission and the ledger
            ev = self.cfg.eval
            items = load_items(ev.task or self.cfg.task, self.cfg.run.seed, self.cfg, self.tokenizer)
            items = task_items(items, self.tokenizer, self.cfg)
            self.evals = EvalIssuer(self.cfg, self.keys, items, self._eval_prompt)
        self.log.info(
            "feeder_ready",
            prompts=len(self.items),
            groups_needed=self.total,
            max_staleness=r.max_staleness,
            groups_per_step=r.groups_per_step,
        )

    async def _counter(self, key: str) -> int:
        return int(await self.broker.get(key) or 0)

    async def step(self) -> bool:
        r = self.cfg.rollout
        version = await self._counter(self.keys.trainer_version)
        if self.evals is not None and (n := await self.evals.maybe_issue(self.broker, version)):
            self.count("eval_prompts", n)
            self.log.info("eval_issued", policy_version=version, prompts=n)
        admitted = await self._counter(self.keys.feeder_admitted)
        released = await self._counter(self.keys.trainer_released)
        budget = admission_budget(
            admitted, released, version, r.max_staleness, r.groups_per_step, total_groups=self.total
        )
        if budget <= 0:
            await asyncio.sleep(0.02)
            return False
        prompts = [self._prompt(admitted + i, version) for i in range(budget)]
        await admit(self.broker, self.keys, [encode(p) for p in prompts], admitted + len(prompts))
        self.count("admitted", len(prompts))
        self.log.debug("admitted", groups=len(prompts), policy_version=version, total=admitted + len(prompts))
        return True

    def _eval_prompt(self, item: dict, group_id: str, group_size: int, version: int) -> Prompt:
        ids = self.tokenizer(item["text"], add_special_tokens=False)["input_ids"]
        return Prompt(
            group_id=group_id,
            prompt_ids=ids,
            group_size=group_size,
            admitted_version=version,
            text=item["text"],
            meta=item.get("meta", {}),
            temperature=self.cfg.eval.temperature,
        )

    def _prompt(self, index: int, version: int) -> Prompt:
        item = self.items[index % len(self.items)]
        ids = self.tokenizer(item["text"], add_special_tokens=False)["input_ids"]
        return Prompt(
            group_id=f"g{index}",
            prompt_ids=ids,
            group_size=self.cfg.rollout.group_size,
            admitted_version=version,
            text=item["text"],
            meta=item.get("meta", {}),
            index=index,
        )
