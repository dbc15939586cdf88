"""Memory a job needs per GPU, from the model's config (its Hugging Face config.json fields): the
trainer's sharded state, a generator's weights and KV cache, and which layouts of trainer ranks and
tensor-parallel generators fit a host's GPUs. `streamrl plan` prints it (streamrl/commands/plan.py).

    shape = ModelShape.from_config(json.load(open("config.json")))
    plan = Plan(shape, kv_tokens=256 * 1024, gpus=8, gpu_gb=80)
    plan.layouts()        # every (trainer ranks, TP, generators) that fits, best first

Estimates, not measurements: the trainer's activations and vLLM's CUDA graphs and workspace are not
counted (TRAINER_HEADROOM and the generator's gpu_memory_utilization leave room for them).
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
TRAIN_BYTES_PER_PARAM = 16
"""FSDP2 trainer state per parameter, sharded over its ranks: float32 master weights (4), float32
gradients (4: FSDP's reduce dtype), AdamW's two float32 moments (8) (streamrl/train/hf_engine.py)."""
TRAINER_HEADROOM = 0.7
"""Share of a trainer GPU its sharded state may take; the rest is for activations (micro-batch x
sequence length x layers, not modelled here), the all-gathered layer and the weight snapshot."""
TP_SIZES = (1, 2, 4, 8)
TRAINER_SIZES = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    @classmethod
    def from_config(cls, raw: dict) -> "ModelShape":
        """From a config.json's fields (a multimodal model's text_config)."""
        raw = raw.get("text_config", raw)
        heads = raw["num_attention_heads"]
        return cls(
            hidden=raw["hidden_size"],
            intermediate=raw["intermediate_size"],
            layers=raw["num_hidden_layers"],
            heads=heads,
            kv_heads=raw.get("num_key_value_heads", heads),
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            vocab=raw["vocab_size"],
            tied=bool(raw.get("tie_word_embeddings", False)),
        )

    @property
    def params(self) -> int:
        """Parameters of a Llama/Qwen3-style decoder (attention, gated MLP, norms, embeddings)."""
        h, d = self.hidden, self.head_dim
        attn = h * self.heads * d * 2 + h * self.kv_heads * d * 2 + 2 * d  # q, o, k, v; Qwen3's q/k norms
        mlp = 3 * h * self.intermediate
        embed = self.vocab * h * (1 if self.tied else 2)
        return self.layers * (attn + mlp + 2 * h) + embed + h

    def kv_bytes_per_token(self, dtype_bytes: int = 2, tp: int = 1) -> int:
        """KV cache of one token on one of `tp` GPUs: keys and values of each layer's KV heads (a KV head
        is split across TP workers, or replicated where there are fewer KV heads than workers)."""
        return 2 * self.layers * max(1, self.kv_heads // tp) * self.head_dim * dtype_bytes

    def tp_fits_heads(self, tp: int) -> bool:
        return self.heads % tp == 0 and (self.kv_heads % tp == 0 or tp % self.kv_heads == 0)


@dataclass(frozen=True)
class Layout:
    trainer_gpus: int
    tp: int
    generators: int
    trainer_gb: float
    """The trainer's sharded state per GPU."""
    generator_gb: float
    """A generator's weights + KV cache per GPU."""


@dataclass(frozen=True)
class Plan:
    shape: ModelShape
    kv_tokens: int
    """Tokens a generator keeps in its KV cache at once (its sequences x max_model_len)."""
    gpus: int = 8
    gpu_gb: float = 80.0
    gpu_memory_utilization: float = 0.9
    """Share of a generator GPU vLLM may take (weights + KV cache + its workspace)."""
    dtype_bytes: int = 2

    @property
    def weights_gb(self) -> float:
        return self.shape.params * self.dtype_bytes / GB

    def trainer_gb(self, ranks: int) -> float:
        return self.shape.params * TRAIN_BYTES_PER_PARAM / ranks / GB

    def generator_gb(self, tp: int) -> tuple[float, float]:
        """(weights, KV cache) per GPU of a generator of `tp` GPUs."""
        kv = self.kv_tokens * self.shape.kv_bytes_per_token(self.dtype_bytes, tp) / GB
        return self.weights_gb / tp, kv

    def min_tp(self) -> int | None:
        """The smallest TP whose weights + KV cache fit one GPU (None: none up to 8)."""
        return next((tp for tp in TP_SIZES if self._generator_fits(tp)), None)

    def min_trainer_gpus(self) -> int | None:
        return next((n for n in TRAINER_SIZES if self.trainer_gb(n) <= self.gpu_gb * TRAINER_HEADROOM), None)

    def _generator_fits(self, tp: int) -> bool:
        return self.shape.tp_fits_heads(tp) and sum(self.generator_gb(tp)) <= self.gpu_gb * self.gpu_memory_utilization

    def layouts(self) -> list[Layout]:
        """Every split of the host's GPUs between trainer ranks (FSDP2) and generators (TP each) that
        fits, no GPU shared: most generator GPUs first, then the smallest TP (more engines), then the
        larger trainer."""
        out = []
        for ranks in TRAINER_SIZES:
            if ranks >= self.gpus or self.trainer_gb(ranks) > self.gpu_gb * TRAINER_HEADROOM:
                continue
            for tp in TP_SIZES:
                count = (self.gpus - ranks) // tp
                if count >= 1 and self._generator_fits(tp):
                    out.append(Layout(ranks, tp, count, self.trainer_gb(ranks), sum(self.generator_gb(tp))))
        return sorted(out, key=lambda lay: (-lay.generators * lay.tp, lay.tp, -lay.trainer_gpus))
