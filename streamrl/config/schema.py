"""The one config schema: every section of a job, validated into `Config`
(streamrl/config/files.py reads YAML files and `--set a.b=c` overrides into it).

    streamrl up --config configs/tiny-cpu.yaml --set trainer.steps=20

Every section is a pydantic model with `extra="forbid"`, so a typo fails before anything
starts, with the field's dotted path and the fix in the message. The sections live in
streamrl/config/ (one module per part of the job); `Config` below assembles them and every
name is imported from here: `from streamrl.config.schema import Config, LossConfig, ...`.
"""

from __future__ import annotations

from pydantic import model_validator

from streamrl.config.base import Section
from streamrl.config.eval import EvalConfig
from streamrl.config.job import BrokerConfig, MetricsConfig, RunConfig, SupervisorConfig, WeightsConfig
from streamrl.config.judge import JudgeConfig, JudgeModelConfig, JudgeScore
from streamrl.config.loss import Advantage, Aggregation, LossConfig
from streamrl.config.model import ModelConfig, TinyModelConfig
from streamrl.config.reasoning_gym import ReasoningGymConfig, check_task_source
from streamrl.config.reward import (
    REWARD_BUILTINS,
    AnnotationsConfig,
    ExternalAnnotation,
    ReferenceConfig,
    RewardComponent,
    RewardConfig,
)
from streamrl.config.rollout import EnvConfig, GeneratorConfig, RolloutConfig
from streamrl.config.sft import SFTConfig
from streamrl.config.task import DatasetConfig, TaskConfig, TaskFields
from streamrl.config.tools import ToolsConfig
from streamrl.config.trainer import LoraConfig, ParallelismConfig, TrainerConfig

__all__ = [
    "Advantage",
    "Aggregation",
    "AnnotationsConfig",
    "BrokerConfig",
    "Config",
    "DatasetConfig",
    "EnvConfig",
    "EvalConfig",
    "ExternalAnnotation",
    "GeneratorConfig",
    "JudgeConfig",
    "JudgeModelConfig",
    "JudgeScore",
    "LossConfig",
    "MetricsConfig",
    "ModelConfig",
    "ParallelismConfig",
    "REWARD_BUILTINS",
    "ReferenceConfig",
    "RewardComponent",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "Section",
    "SupervisorConfig",
    "TaskConfig",
    "TaskFields",
    "TinyModelConfig",
    "TrainerConfig",
    "LoraConfig",
    "WeightsConfig",
]


def check_device_entries(devices: dict[str, list[str]], tp: int) -> None:
    """supervisor.devices rules that need no host: no GPU twice in one process's entry, and each
    tensor-parallel generator's entry as many GPUs as its engine spans (the host's rules: streamrl/launch/placement.py)."""
    for role, entries in devices.items():
        for entry in entries:
            ids = entry.split(",")
            if len(set(ids)) < len(ids):
                raise ValueError(
                    f"supervisor.devices.{role} entry {entry!r} lists a GPU twice; list each GPU of a process once"
                )
            # tp=1 may list more (cuda_ipc gives generators the trainer's list; vLLM takes the first)
            if role == "generator" and (len(ids) < tp or (tp > 1 and len(ids) != tp)):
                raise ValueError(
                    f"supervisor.devices.generator entry {entry!r} gives a generator {len(ids)} GPU(s), but "
                    f"generator.tensor_parallel_size={tp} spans {tp}; list {tp} GPUs per generator "
                    f"(e.g. {','.join(map(str, range(tp)))!r}) or set tensor_parallel_size={len(ids)}"
                )


class Config(Section):
    run: RunConfig = RunConfig()
    broker: BrokerConfig = BrokerConfig()
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    rollout: RolloutConfig = RolloutConfig()
    generator: GeneratorConfig = GeneratorConfig()
    reward: RewardConfig = RewardConfig()
    reference: ReferenceConfig = ReferenceConfig()
    judge: JudgeConfig | None = None
    """LLM-judge workers (streamrl/config/judge.py); absent: none, and no rollout waits for a judge."""
    env: EnvConfig = EnvConfig()
    tools: ToolsConfig = ToolsConfig()  # chat templates and tools of episodes (streamrl/config/tools.py)
    loss: LossConfig = LossConfig()
    trainer: TrainerConfig = TrainerConfig()
    weights: WeightsConfig = WeightsConfig()
    supervisor: SupervisorConfig = SupervisorConfig()
    annotations: AnnotationsConfig = AnnotationsConfig()
    metrics: MetricsConfig = MetricsConfig()
    sft: SFTConfig = SFTConfig()
    """`streamrl sft` only: supervised fine-tuning data, loss tokens, packing, eval."""

    eval: EvalConfig = EvalConfig()
    reasoning_gym: ReasoningGymConfig = (
        ReasoningGymConfig()
    )  # task.name=reasoning_gym (streamrl/config/reasoning_gym.py)

    @model_validator(mode="after")
    def _cross(self) -> "Config":
        check_task_source(self)
        if self.rollout.group_size < 2:
            # Every advantage (group_norm, group_mean, loo; whichever loss.name fixes, e.g. dr_grpo's
            # group_mean) compares a sample with the rest of its group: alone, it is 0 (or undefined).
            # Named without loss.advantage, which an objective may override.
            raise ValueError(
                f"rollout.group_size={self.rollout.group_size} leaves no group baseline: every advantage "
                "compares a sample with the others of its group, so a lone sample never learns; set "
                "rollout.group_size>=2"
            )
        devices = self.supervisor.devices
        if self.weights.backend == "cuda_ipc" and devices.get("trainer") != devices.get("generator"):
            raise ValueError(
                f"weights.backend=cuda_ipc shares GPU memory between processes that see the same GPUs, but "
                f"supervisor.devices gives the trainer {devices.get('trainer')} and generators "
                f"{devices.get('generator')}; give both the same list or set weights.backend=shm"
            )
        trainer_gpus = devices.get("trainer")
        if trainer_gpus and self.trainer.device == "cuda" and len(trainer_gpus[0].split(",")) < self.trainer.world_size:
            raise ValueError(
                f"trainer.world_size={self.trainer.world_size} needs that many GPUs, but supervisor.devices."
                f'trainer gives {trainer_gpus[0]!r}; list one GPU per rank (e.g. "0,1") or lower world_size'
            )
        check_device_entries(devices, self.generator.tensor_parallel_size)
        loras, keep = self.generator.max_loras, self.rollout.max_staleness + 1
        if self.trainer.lora.enabled and loras is not None and loras < keep:
            raise ValueError(
                f"generator.max_loras={loras} cannot hold the {keep} adapter versions a request may still "
                f"use with rollout.max_staleness={self.rollout.max_staleness}; set generator.max_loras>={keep} "
                "(or leave it unset: max_staleness + 1)"
            )
        self._resolve_reference()
        if self.loss.overlong_buffer > self.generator.max_tokens:
            raise ValueError(
                f"loss.overlong_buffer={self.loss.overlong_buffer} exceeds generator.max_tokens="
                f"{self.generator.max_tokens}; set loss.overlong_buffer to about max_tokens/5"
            )
        if self.tools.chat and self.task.chat_template is False:
            raise ValueError(
                "tools.chat=true renders episodes with the chat template, but task.chat_template=false asks "
                "for raw-text prompts; remove task.chat_template (or set it to auto), or set tools.chat=false"
            )
        if self.judge is not None:
            taken = ["reward", "ref_logprobs"] + [e.key for e in self.annotations.external]
            if self.judge.key in taken:
                raise ValueError(
                    f"judge.key={self.judge.key!r} is already used (built-in keys and annotations.external: "
                    f"{taken}); give the judge its own key, e.g. judge.key=judge"
                )
        return self

    def _resolve_reference(self) -> None:
        """reference.source `auto` resolved (`trainer` with trainer.lora), and reference.count 0 when the
        trainer computes the reference log-probs, so the written config says no reference worker runs."""
        ref, lora = self.reference, self.trainer.lora.enabled
        if ref.source == "trainer" and not lora:
            raise ValueError(
                "reference.source=trainer computes the reference log-probs from the trainer's own model with "
                "its LoRA adapter disabled, but trainer.lora is off (the trainer's model is then the policy "
                "itself); set trainer.lora.rank > 0, or reference.source=worker (or auto)"
            )
        if ref.source == "auto":
            ref.source = "trainer" if lora else "worker"
        if ref.source != "trainer":
            return
        if ref.count > 0 and "count" in ref.model_fields_set:
            raise ValueError(
                f"reference.count={ref.count} asks for reference workers, but with trainer.lora the trainer "
                "computes the reference log-probs itself (its model with the adapter disabled: no second copy "
                "of the model); remove reference.count (or set it to 0), or set reference.source=worker to run "
                f"{ref.count} reference worker(s) with their own copy of the base model"
            )
        ref.count = 0

    def reference_in_trainer(self) -> bool:
        """The trainer computes the reference log-probs (reference.source=trainer): no reference worker
        annotates `ref_logprobs`, the assembler does not wait for them."""
        return self.reference.source == "trainer"

    def chat_prompts(self, has_template: bool) -> bool:
        """Whether the feeder renders prompts with the chat template (task.chat_template resolved), for a
        tokenizer that has one (`has_template`) or not; a task of chat messages (task.fields.messages)
        renders its own, so False."""
        if self.task.fields.messages is not None:
            return False
        if self.tools.chat or self.task.chat_template is True:
            return True
        return self.task.chat_template == "auto" and has_template and self.env.fn is None

    def reward_weights(self) -> dict[str, float]:
        """Annotation key -> its weight in the trained reward: `reward` (annotations.reward_weight), the
        judge's key (judge.weight), each external key (its weight)."""
        weights = {"reward": self.annotations.reward_weight}
        if self.judge is not None:
            weights[self.judge.key] = self.judge.weight
        return weights | {e.key: e.weight for e in self.annotations.external}

    def required_annotations(self) -> list[str]:
        """Annotation keys a rollout needs before the trainer may use it."""
        keys = ["reward"]
        if self.loss.kl_beta > 0 and not self.reference_in_trainer():
            keys.append("ref_logprobs")
        if self.judge is not None:
            keys.append(self.judge.key)
        return keys + [e.key for e in self.annotations.external]
