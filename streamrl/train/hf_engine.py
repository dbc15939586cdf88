"""The hf trainer backend: an FSDP2-sharded Hugging Face causal LM, its log-prob recomputation and its
full state dict; the loss, micro-batches and optimizer step are StepEngine's (streamrl/train/step_engine.py).

Runs inside every torch.distributed rank of the trainer (see streamrl/train/dist.py):

    def rank_main(rank, world):
        engine = HFEngine(cfg, model_path, rank, world)      # a streamrl.train.engine_interface.TrainerEngine
        batch = broadcast_object(batch_or_none_on_other_ranks)  # streamrl.train.dist
        metrics = engine.train_step(batch)          # identical on every rank
        state = engine.full_state_dict()            # HF names on rank 0, None elsewhere
    launch(cfg.trainer.world_size, rank_main)

LoRA (trainer.lora, streamrl/train/lora.py): peft injects the adapters before sharding and freezes the
base; `model` stays the inner transformers model (the FSDP root), so log-probs and checkpoints take
the full-weight paths, and `peft` keeps the wrapper for its names. The state published and checkpointed
is then the adapter only (plus its optimizer state in checkpoints), and `reference_mode()` disables the
adapter: the reference log-probs (reference.source=trainer) are the frozen base's, with no second copy.

Sharding: each decoder layer (the model's `_no_split_modules` classes) is one FSDP2 unit, then the
root (embeddings, final norm, lm_head). FSDP2 averages gradients over ranks; the loss library
pre-scales by dp_world_size and divides by the whole batch's token/sequence counts, so summing
micro-batch gradients here gives exactly the single-process full-batch gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from streamrl.core.errors import ConfigError
from streamrl.models.hf import causal_lm_logprobs, check_plain_head
from streamrl.train.lora import adapter_config, adapter_state, adapters_disabled, add_adapters
from streamrl.train.step_engine import StepEngine
from streamrl.weights.cuda_ipc_publish import pack_stream
from streamrl.weights.store import WeightStream, module_weight_stream


def _load_model(model_path: str, dtype: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    # Dropout off: recomputed log-probs must be deterministic (they are compared with the sampler's,
    # and prox_logprobs reuses this forward's values).
    for key, value in vars(config).items():
        if "dropout" in key and isinstance(value, float):
            setattr(config, key, 0.0)
    # Master weights stay float32; a lower model.dtype becomes FSDP's compute dtype instead.
    model = AutoModelForCausalLM.from_pretrained(model_path, config=config, dtype=torch.float32)
    return model, getattr(torch, dtype)


def shard_model(model: torch.nn.Module, mesh, compute_dtype: torch.dtype) -> None:
    """fully_shard each decoder layer, then the root (in place)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    layer_names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in layer_names]
    if not layers:
        raise ConfigError(
            f"{type(model).__name__} declares no decoder layer classes (_no_split_modules), so the "
            "trainer cannot shard it per layer; use a transformers model class that declares them"
        )
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)


class HFEngine(StepEngine):
    """One rank's FSDP2-sharded transformers model; the training step is StepEngine's
    (streamrl/train/step_engine.py), shared with the torchtitan backend."""

    def _build(self, model_path: str) -> None:
        """Load the model onto this rank and shard it: sets model, pad_id, vocab_size."""
        from torch.distributed.device_mesh import init_device_mesh

        tc = self.cfg.trainer
        model, compute_dtype = _load_model(model_path, self.cfg.model.dtype)
        self.pad_id = int(model.config.pad_token_id or 0)
        self.vocab_size = getattr(model.config, "vocab_size", None)
        if tc.activation_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.peft = add_adapters(model, tc.lora, model_path) if tc.lora.enabled else None
        self._peft_names: dict[str, str] | None = None
        model.to(self.device)
        model.train()
        if tc.logprob_chunk_tokens:
            check_plain_head(model)  # a model chunking cannot serve fails here, not at the first step
        shard_model(model, init_device_mesh(self.device.type, (self.world_size,)), compute_dtype)
        self.model = model

    def logprobs(self, padded: dict[str, Tensor], with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """Current-policy log-probs [B, T] of the completion tokens (graph kept for backward).

        The reference worker's function (streamrl.models.hf.causal_lm_logprobs): with
        trainer.logprob_chunk_tokens > 0 the logits are formed a chunk of tokens at a time from the
        decoder's hidden states (streamrl.models.logprobs); 0 materialises the model's full logits."""
        return causal_lm_logprobs(
            self.model,
            padded,
            self.cfg.generator.temperature,
            self.cfg.trainer.logprob_chunk_tokens,
            with_entropy,
            self.cfg.trainer.logprob_kernel,
        )

    def reference_mode(self):
        """With trainer.lora: the adapter disabled (streamrl.train.lora.adapters_disabled), the base model."""
        if self.peft is None:
            return super().reference_mode()
        return adapters_disabled(self.model)

    def full_state_dict(self) -> dict[str, Tensor] | None:
        """Full HF-named weights on rank 0 (detached CPU copies), None elsewhere; collective. With
        trainer.lora only the adapter's tensors, under peft's names (`base_model.model.<...>.lora_A.weight`):
        packed into one flat buffer on this rank's device and brought to the CPU in one copy."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if self.peft is not None:
            packed = pack_stream(self.weight_stream(), self.device)
            if packed is None:
                return None
            # views of one CPU buffer: a fresh copy, so training may continue while it is published
            return dict(packed.tensors(packed.buffer.to("cpu")))
        # cpu_offload gathers one tensor at a time to rank 0's CPU: no full copy on other ranks.
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.model, options=options)
        if self.rank != 0:
            return None
        # With one CPU rank the "gathered" tensor IS the live parameter; the caller publishes this
        # dict while training continues, so copy exactly those (other ranks' gathers are fresh).
        live = {p.to_local().untyped_storage().data_ptr() for p in self.model.parameters()}
        live |= {b.untyped_storage().data_ptr() for b in self.model.buffers()}
        out = {}
        for key, value in state.items():
            value = value.detach().to("cpu").contiguous()
            out[key] = value.clone() if value.untyped_storage().data_ptr() in live else value
        return out

    def _adapter_names(self) -> dict[str, str]:
        """Inner parameter name -> peft's published name of every trained (adapter) parameter, in
        named_parameters order; worked out once (peft's renaming, on placeholders), then cached. The
        names only: FSDP2 swaps the registered parameter objects between sharded and unsharded."""
        if self._peft_names is None:
            marks = {
                name.replace("_checkpoint_wrapped_module.", ""): torch.zeros(1)  # get_model_state_dict's FQN
                for name, p in self.model.named_parameters()
                if p.requires_grad
            }
            inner = {id(t): name for name, t in marks.items()}
            self._peft_names = {inner[id(t)]: peft for peft, t in adapter_state(self.peft, marks).items()}
        return self._peft_names

    def _adapter_stream(self) -> WeightStream:
        """The adapter's parameters one at a time, whole, on this rank's device (no host copies: the
        publisher packs them where it wants them); collective, filled on rank 0. Only these:
        get_model_state_dict gathers every parameter before it drops the frozen ones, which on the H200
        made an adapter publish of a 1.7B model stall the trainer ~1 s, the frozen 3.4 GB gathered for nothing."""
        names = self._adapter_names()
        params = [
            (names[n], p)
            for name, p in self.model.named_parameters()
            if (n := name.replace("_checkpoint_wrapped_module.", "")) in names
        ]
        receiver = self.rank == 0
        layout = [(peft, p.dtype, list(p.shape)) for peft, p in params] if receiver else []

        def values():
            with torch.no_grad():
                for _, p in params:
                    full = p
                    if hasattr(p, "full_tensor"):  # one rank holds it all already, else gather this one
                        full = p.to_local() if p.device_mesh.size() == 1 else p.full_tensor()
                    yield full.detach() if receiver else None

        return WeightStream(layout, values(), receiver)

    def weight_stream(self) -> WeightStream:
        """One parameter all-gathered at a time; transformers modules already carry HF names. With
        trainer.lora the adapter's parameters only, under peft's names."""
        if self.peft is not None:
            return self._adapter_stream()
        return module_weight_stream(self.model, receiver=self.rank == 0)

    def adapter_config(self) -> dict | None:
        """The PEFT adapter_config.json content of the published adapter; None without trainer.lora."""
        return adapter_config(self.peft) if self.peft is not None else None

    def checkpoint_options(self) -> dict:
        """With trainer.lora the frozen base stays out of checkpoints (it is model.path's, unchanged)."""
        return {"ignore_frozen_params": True} if self.peft is not None else {}
