"""The judge's vLLM engine: the generator's engine start (streamrl/generate/vllm_engine.py) on the judge
model, and one call that turns a batch of rendered prompts into the judge's output texts.

    engine = JudgeEngine(cfg)              # cfg: the whole Config (judge.model.path=policy reads model.path)
    await engine.start()
    outputs = await engine.judge([("r1", prompt_ids), ...], "batch-1")   # [text or RequestFailed] per prompt
    engine.shutdown()

Here, not in streamrl/annotate, because the vLLM engines live in this stage (the judge worker,
workers/judge.py, joins the two). A prompt that does not fit judge.max_model_len, or that vLLM
rejects, is that rollout's RequestFailed (the worker makes it the rollout's annotation error);
a dead engine raises (the worker exits, `streamrl up` restarts it, its pending rollouts are taken over).
"""

from __future__ import annotations

import asyncio

from streamrl.config.judge import POLICY
from streamrl.config.schema import Config, GeneratorConfig
from streamrl.core.errors import ConfigError
from streamrl.generate.vllm_engine import VLLMEngine, sample_seed


class RequestFailed(Exception):
    """One judge request failed (too long, rejected by vLLM); the message says why and what to change."""


def judge_model(cfg: Config) -> tuple[str, str]:
    """(path, vLLM dtype) of the judge model."""
    j = cfg.judge.model
    if j.path == POLICY:
        if cfg.model.path is None:
            raise ConfigError("judge.model.path=policy needs model.path resolved first (streamrl worker does this)")
        return cfg.model.path, cfg.model.dtype if j.dtype == "auto" else j.dtype
    return j.path, j.dtype


def engine_settings(cfg: Config) -> GeneratorConfig:
    """The generator settings VLLMEngine.start reads, filled from the judge section (sampling is the
    judge's own: JudgeEngine.params)."""
    j = cfg.judge
    return GeneratorConfig(
        max_model_len=j.max_model_len,
        gpu_memory_utilization=j.gpu_memory_utilization,
        cpu_kvcache_gb=j.cpu_kvcache_gb,
        kv_cache_memory_gb=j.kv_cache_memory_gb,
        enforce_eager=j.enforce_eager,
        max_num_seqs=j.batch_size,
        max_tokens=j.max_tokens,
        start_timeout_s=j.start_timeout_s,
    )


class JudgeEngine:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.j = cfg.judge
        path, dtype = judge_model(cfg)
        self.engine = VLLMEngine(path, engine_settings(cfg), dtype=dtype, seed=cfg.run.seed, section="judge")
        self.allowed: list[int] | None = None

    async def start(self) -> None:
        await self.engine.start()
        self.allowed = self._allowed_ids() if self.j.allowed_tokens else None

    def _allowed_ids(self) -> list[int]:
        tok = self.engine.get_tokenizer()
        ids = []
        for text in self.j.allowed_tokens:
            got = tok.encode(text, add_special_tokens=False)
            if len(got) != 1:
                raise ConfigError(
                    f"judge.allowed_tokens: {text!r} is {len(got)} tokens of the judge's tokenizer, not one; "
                    "list single tokens (e.g. the digits '0'..'9')"
                )
            ids.append(got[0])
        return ids

    def prompt_ids(self, text: str) -> list[int]:
        """Token ids of one rendered judge prompt (in the chat template when judge.chat_template)."""
        tok = self.engine.get_tokenizer()
        if not self.j.chat_template:
            return tok.encode(text)
        chat = tok.apply_chat_template(
            [{"role": "user", "content": text}],
            tokenize=False,
            add_generation_prompt=True,
            **self.j.chat_template_kwargs,
        )
        return tok.encode(chat, add_special_tokens=False)

    def params(self, rollout_id: str):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            n=1,
            temperature=self.j.temperature,
            max_tokens=self.j.max_tokens,
            seed=sample_seed(self.cfg.run.seed, rollout_id, 0),  # a rollout judged twice scores the same
            allowed_token_ids=self.allowed,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def _one(self, rollout_id: str, ids: list[int], attempt: str) -> str | RequestFailed:
        from vllm.v1.engine.exceptions import EngineDeadError

        room = self.j.max_model_len - self.j.max_tokens
        if len(ids) > room:
            return RequestFailed(
                f"judge prompt is {len(ids)} tokens, over judge.max_model_len - judge.max_tokens = {room}; "
                "raise judge.max_model_len or shorten judge.template"
            )
        text = ""
        try:
            async for out in self.engine.llm.generate({"prompt_token_ids": ids}, self.params(rollout_id), attempt):
                text = out.outputs[0].text
        except EngineDeadError:
            raise
        except Exception as exc:  # vLLM rejected this one request (a bad prompt): that rollout's error
            return RequestFailed(f"judge engine failed on this rollout: {type(exc).__name__}: {exc}"[:500])
        return text

    async def judge(self, requests: list[tuple[str, list[int]]], tag: str) -> list[str | RequestFailed]:
        """The judge's text for each (rollout id, prompt ids), all sent to the engine at once; `tag`
        makes the request ids unique to this batch (a rollout may be judged again after a takeover)."""
        return list(await asyncio.gather(*(self._one(rid, ids, f"{tag}:{rid}") for rid, ids in requests)))

    def shutdown(self) -> None:
        self.engine.shutdown()
