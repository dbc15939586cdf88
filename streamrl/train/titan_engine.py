"""The torchtitan trainer backend: torchtitan's Llama 3 / Qwen 3 under its own parallelize functions.

    streamrl up --set trainer.backend=torchtitan --set trainer.world_size=2

A sibling of the hf backend (streamrl/train/hf_engine.HFEngine): both are StepEngines
(streamrl/train/step_engine.py: micro-batch/loss loop, optimizer, lr schedule); what differs is the model:
- built from torchtitan's layer builders with the checkpoint's shape (streamrl/models/titan.py),
  the Hugging Face weights loaded through torchtitan's state-dict adapter (from_hf);
- parallelized by the architecture's torchtitan function from trainer.parallelism: FSDP2 over
  dp_shard (HSDP with dp_replicate), tensor parallel over tp, activation checkpointing, compile;
- published with the adapter's to_hf, one parameter at a time on the device (weight_stream), so the
  weight store and vLLM see Hugging Face names.
Batches are split over data-parallel ranks only: the ranks of one tensor-parallel group train on
the same rows. Gradients are averaged over data-parallel ranks, as with the hf backend, so both
backends take the same step on the same batch.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from streamrl.config.schema import Config
from streamrl.core.errors import ConfigError
from streamrl.models.hf import unsharded_weight
from streamrl.models.logprobs import gathered_logprobs, token_logprobs, use_compiled_kernel
from streamrl.models.titan import TitanSpec, read_hf_config, titan_spec
from streamrl.train.engine_interface import TrainerEngine
from streamrl.train.row_packing import pack_rows
from streamrl.train.step_engine import StepEngine
from streamrl.weights.store import WeightStream

WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
"""Name parts that activation checkpointing / compile wrappers insert; the adapter expects none."""


def clean_name(name: str) -> str:
    for part in WRAPPER_PREFIXES:
        name = name.replace(part, "")
    return name


def load_hf_weights(model_path: str | Path) -> dict[str, Tensor]:
    """Every tensor of the folder's *.safetensors files, HF names (CPU)."""
    from safetensors.torch import load_file

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise ConfigError(
            f"no *.safetensors in {model_path}; the torchtitan backend loads safetensors "
            "checkpoints (save the model with save_pretrained(safe_serialization=True))"
        )
    out: dict[str, Tensor] = {}
    for f in files:
        out.update(load_file(f))
    return out


def parallel_dims(cfg: Config, world_size: int, device: torch.device):
    """torchtitan ParallelDims + ParallelismConfig from trainer.parallelism, its mesh built on `device`."""
    from torchtitan.config import ParallelismConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import parallel_dims as pd_module
    from torchtitan.distributed import utils as dist_utils

    par = cfg.trainer.parallelism
    titan_par = ParallelismConfig(
        data_parallel_replicate_degree=par.dp_replicate,
        data_parallel_shard_degree=par.shard_degree(world_size),
        tensor_parallel_degree=par.tp,
        spmd_backend="partial_dtensor",
        # Sequence parallel shards activations along the sequence, which then must divide by tp;
        # rollouts have any length, so TP runs with replicated activations.
        enable_sequence_parallel=False,
    )
    dist_utils.set_spmd_backend(titan_par.spmd_backend)
    dims = ParallelDims.from_config(titan_par, world_size)
    # torchtitan picks the mesh's device type once at import ("cuda" on a CPU-only build) and
    # build_mesh takes no argument for it; the trainer's device decides, so gloo/CPU ranks get a
    # CPU mesh: the module global is set for the call and restored after it.
    imported = pd_module.device_type
    pd_module.device_type = device.type
    try:
        dims.build_mesh()
    finally:
        pd_module.device_type = imported
    return dims, titan_par


def build_loaded_model(spec: TitanSpec, model_path: str, titan_par) -> torch.nn.Module:
    """The architecture's model on CPU in float32 with the checkpoint's weights (before sharding).

    fully_shard then moves each rank's shards (and the RoPE buffers) to the trainer's device, so a
    GPU never holds the whole model.
    """
    spec.config.update_from_config(config=SimpleNamespace(parallelism=titan_par))
    with torch.device("meta"):
        model = spec.config.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))  # RoPE tables; weights come next
    state = spec.adapter(spec.config, None).from_hf(load_hf_weights(model_path))
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ConfigError(
            f"{model_path} does not match torchtitan's {spec.name}: missing "
            f"{result.missing_keys[:5]}, unexpected {result.unexpected_keys[:5]}"
        )
    return model


def data_parallel_coords(dims, rank: int, world_size: int):
    """(dp_rank, dp_size, group to reduce metrics over; None = all ranks) of this rank."""
    import torch.distributed as dist

    mesh = dims.get_optional_mesh("batch")  # None when the data-parallel degree is 1
    if mesh is not None and mesh.size() == world_size:
        return mesh.get_local_rank(), mesh.size(), None
    if mesh is not None:
        return mesh.get_local_rank(), mesh.size(), mesh.get_group()
    # Pure tensor parallel: every rank holds the one data shard; new_group is collective, so
    # each rank creates every singleton group and keeps its own.
    groups = [dist.new_group([r]) for r in range(world_size)] if world_size > 1 else [None]
    return 0, 1, groups[rank]


class TitanEngine(StepEngine):
    """One rank's torchtitan model + AdamW; every method is collective (all ranks call it in step).

    StepEngine.__init__ runs as for the hf backend; only the model (`_build`), its forward and its
    weights' names differ."""

    def _build(self, model_path: str) -> None:
        if self.cfg.model.dtype == "float16":
            raise ConfigError("the torchtitan backend computes in float32 or bfloat16; set model.dtype=bfloat16")
        self.spec = titan_spec(model_path)
        hf_config = read_hf_config(model_path)
        self.pad_id = int(hf_config.get("pad_token_id") or 0)
        self.vocab_size = hf_config.get("vocab_size")
        self.dims, titan_par = parallel_dims(self.cfg, self.world_size, self.device)
        model = build_loaded_model(self.spec, model_path, titan_par)
        self.model = self._parallelize(model, titan_par)
        if self.cfg.trainer.pack_rows:
            from streamrl.models.document_attention import enable_document_attention

            enable_document_attention(self)  # packed rows: attention within each rollout only
        self.model.train()
        self.dp_rank, self.dp_size, self.dp_group = data_parallel_coords(self.dims, self.rank, self.world_size)

    def _parallelize(self, model: torch.nn.Module, titan_par) -> torch.nn.Module:
        from torch.distributed.fsdp import FSDPModule
        from torchtitan.config import CompileConfig, TrainingConfig
        from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

        tc = self.cfg.trainer
        ac = None
        if tc.activation_checkpointing:
            ac = FullAC.Config() if tc.parallelism.ac_policy == "full" else SelectiveAC.Config()
        model = self.spec.parallelize(
            model,
            parallel_dims=self.dims,
            parallelism=titan_par,
            ac_config=ac,
            dump_folder="",
            training=TrainingConfig(mixed_precision_param=self.cfg.model.dtype, mixed_precision_reduce="float32"),
            compile_config=CompileConfig(enable=tc.parallelism.compile, components=["model"]),
        )
        # torchtitan sums gradients over data-parallel ranks (its loss divides by the global token
        # count); streamrl's losses are pre-scaled for an average, as FSDP2 does by default.
        dp = self.dims.dp_replicate * self.dims.dp_shard
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(float(dp))
        return model

    def model_inputs(self, mb) -> dict[str, Tensor]:
        """pad_batch's tensors, plus the packed rows (streamrl/train/row_packing.py) with trainer.pack_rows."""
        out = super().model_inputs(mb)
        tc = self.cfg.trainer
        if tc.pack_rows:
            out.update(pack_rows(out["attention_mask"], out["input_ids"], tc.pack_rows, self.pad_id, tc.seq_multiple()))
        return out

    def _forward(self, padded: dict[str, Tensor]) -> Tensor:
        """The model's output per input position of the right-padded [B, L] rows."""
        if "packed_ids" not in padded:
            out = self.model(padded["input_ids"])
            return out.full_tensor() if isinstance(out, DTensor) else out
        from streamrl.models.document_attention import document_attention_mask

        pos = padded["packed_positions"]
        out = self.model(padded["packed_ids"], positions=pos, attention_masks=document_attention_mask(pos))
        out = out.full_tensor() if isinstance(out, DTensor) else out
        return out.reshape(-1, out.shape[-1])[padded["unpack_index"]]

    def logprobs(self, padded: dict[str, Tensor], with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """Current-policy log-probs [B, T] of the completion tokens (graph kept for backward).

        No attention mask: rows are right-padded (pad_batch), so under causal attention a real token
        never attends to padding, and padded positions are masked out of the loss. With
        trainer.pack_rows the forward runs on the packed rows with document-masked attention and its
        output is gathered back into the [B, L] layout (streamrl/train/row_packing.py). With
        trainer.logprob_chunk_tokens > 0 the model stops before its LM head (torchtitan's
        `_skip_lm_head`, as its ChunkedLossWrapper does) and streamrl.models.logprobs forms the logits a
        chunk of tokens at a time.
        """
        chunk = self.cfg.trainer.logprob_chunk_tokens
        self.model._skip_lm_head = bool(chunk)
        out = self._forward(padded)  # tensor parallel: replicated hidden states / vocab-sharded logits, gathered
        if not chunk:
            return token_logprobs(
                out, padded["positions"], padded["targets"], self.cfg.generator.temperature, with_entropy
            )
        head = self.model.lm_head
        weight = unsharded_weight(head, head)
        bias = unsharded_weight(head, head, "bias") if getattr(head, "bias", None) is not None else None
        return gathered_logprobs(
            out,
            weight,
            bias,
            padded["positions"],
            padded["targets"],
            padded["lengths"],
            self.cfg.generator.temperature,
            chunk,
            with_entropy,
            use_compiled_kernel(self.cfg.trainer.logprob_kernel, out.device),
        )

    def full_state_dict(self) -> dict[str, Tensor] | None:
        """Full HF-named weights on rank 0 (CPU copies), None elsewhere; collective.

        Parameters are gathered one at a time and only rank 0 keeps them, so no rank but rank 0
        ever holds more than one full tensor.
        """
        native: dict[str, Tensor] = {}
        for name, param in self.model.named_parameters():
            full = param.full_tensor() if isinstance(param, DTensor) else param
            if self.rank == 0:
                native[clean_name(name)] = full.detach().to("cpu", copy=True)
            del full
        if self.rank != 0:
            return None
        hf = self.spec.adapter(self.spec.config, None).to_hf(native)
        return {k: v.contiguous() for k, v in hf.items()}

    def weight_stream(self) -> WeightStream:
        """One parameter gathered and converted at a time, on the trainer's device (collective).

        The conversion plan (streamrl names -> HF names and shapes) is made once, on meta tensors.
        Each full tensor is the adapter's to_hf of that one parameter: a rename (a view of the live
        parameter on one rank; Llama's q/k permutation makes a new tensor), so the publisher copies
        it straight into its buffer. Where the adapter cannot convert one tensor at a time (its
        whole-state conversion differs), the stream falls back to full_state_dict.
        """
        plan = self._publish_plan
        if plan is None:
            return TrainerEngine.weight_stream(self)
        receiver = self.rank == 0
        adapter = self.spec.adapter(self.spec.config, None)
        layout = [entry for _, _, entries in plan for entry in entries] if receiver else []

        def values():
            with torch.no_grad():
                for name, param, entries in plan:
                    full = param
                    if isinstance(param, DTensor):  # one rank holds it all already, else gather it
                        full = param.to_local() if param.device_mesh.size() == 1 else param.full_tensor()
                    if not receiver:
                        yield from (None for _ in entries)
                        continue
                    hf = adapter.to_hf({name: full.detach()})
                    yield from (hf[hf_name] for hf_name, _, _ in entries)
                    del full, hf

        return WeightStream(layout, values(), receiver)

    @cached_property
    def _publish_plan(self) -> list[tuple[str, Tensor, list[tuple[str, torch.dtype, list[int]]]]] | None:
        """[(clean name, parameter, [(HF name, dtype, shape), ...])] in the order of the adapter's
        whole-state to_hf; parameters the adapter drops (a tied LM head) are left out. None where
        converting one parameter at a time does not give the whole-state conversion."""
        params = [(clean_name(n), p) for n, p in self.model.named_parameters()]
        meta = {n: torch.empty(p.shape, dtype=p.dtype, device="meta") for n, p in params}
        whole = self.spec.adapter(self.spec.config, None).to_hf(dict(meta))
        plan, flat = [], []
        for name, param in params:
            one = self.spec.adapter(self.spec.config, None).to_hf({name: meta[name]})
            entries = [(k, v.dtype, list(v.shape)) for k, v in one.items()]
            flat += entries
            if entries:
                plan.append((name, param, entries))
        expected = [(k, v.dtype, list(v.shape)) for k, v in whole.items()]
        return plan if flat == expected else None
