"""File format of a training workload (`models/*.json`): an architecture, measured profiles, or both.

Layer indices count the workload's layers in order: 0 is the embedding, 1..L the transformer
blocks, L+1 the final norm and head. A profile must have exactly that many entries.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, field_validator, model_validator


class Strict(BaseModel):
    """Unknown fields are errors: a misspelt key must not be silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Architecture(Strict):
    """Decoder-only transformer dimensions; FLOPs and bytes per layer are derived from these."""

    layers: PositiveInt = Field(description="transformer blocks (embedding and head not counted)")
    hidden: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt | None = Field(None, description="grouped-query attention; default = heads")
    head_dim: PositiveInt | None = Field(
        None, description="width of one attention head when it is not hidden / heads (Qwen3, Megatron-LM's "
        "--kv-channels): Q, K, V and the output projection are heads x head_dim wide. Default: hidden / heads")
    ffn: PositiveInt = Field(description="MLP inner size")
    vocab: PositiveInt
    seq_len: PositiveInt = Field(description="default training sequence length")
    gated_mlp: bool = Field(False, description="SwiGLU-style MLP with three matrices (Llama)")
    tied_embeddings: bool = Field(False, description="head shares the embedding matrix")
    learned_positions: bool = Field(True, description="learned position embeddings (GPT); false for RoPE")
    family: str | None = Field(
        None, description="the model's code family (Hugging Face model_type: gpt2, opt, gpt_neo, llama, qwen2...): "
        "with a stack that runs Hugging Face's modelling code it decides the activations kept for backward")

    @model_validator(mode="after")
    def _heads_divide(self) -> "Architecture":
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        return self

    @property
    def head_width(self) -> int:
        """One attention head's width: head_dim, or hidden / heads."""
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of Q and of the attention output (heads x head width); hidden unless head_dim says otherwise."""
        return self.heads * self.head_width

    @property
    def kv_dim(self) -> int:
        """Width of K and of V (KV heads x head width)."""
        return (self.kv_heads or self.heads) * self.head_width


LayerTimes = tuple[float, float, float]
"""(forward_s, backward_s, optimizer_update_s) of one layer for one micro-batch."""


class Profile(Strict):
    """Measured per-layer times on one device type: times[micro_batch_size][tp_degree][layer]."""

    device_type: str = Field(description="device type name the profile was measured on, e.g. GH-96")
    source: str = ""
    times: dict[str, dict[str, list[LayerTimes]]] = Field(
        description="keys are micro-batch size and TP degree as strings; one (fwd, bwd, update) per layer")
    update_is_whole_model: bool = Field(
        True, description="the update column is the optimizer step of the whole model (Sailor), "
        "scaled by a stage's share of the parameters")

    @field_validator("times")
    @classmethod
    def _not_empty(cls, times: dict[str, dict[str, list[LayerTimes]]]) -> dict[str, dict[str, list[LayerTimes]]]:
        if not times or any(not per_tp for per_tp in times.values()):
            raise ValueError('give {"MBS": {"TP": [[fwd, bwd, update], ...]}}, one row per layer')
        return times

    @model_validator(mode="after")
    def _shape(self) -> "Profile":
        lengths = {len(per_layer) for per_tp in self.times.values() for per_layer in per_tp.values()}
        if len(lengths) > 1:
            raise ValueError(f"every (micro-batch, tp) entry must list the same number of layers, got {sorted(lengths)}")
        for mbs, per_tp in self.times.items():
            for tp, per_layer in per_tp.items():
                if not (mbs.isdigit() and int(mbs) > 0 and tp.isdigit() and int(tp) > 0):
                    raise ValueError(f"keys must be positive integers as strings, got mbs={mbs!r} tp={tp!r}")
                if any(t < 0 for layer in per_layer for t in layer):
                    raise ValueError(f"negative time in times[{mbs}][{tp}]")
        return self


class LayerBytes(Strict):
    """Per-layer sizes for a workload known only by its profile (no architecture)."""

    params: list[NonNegativeInt] = Field(description="parameters per layer (elements, not bytes)")
    activation_bytes_per_sample: list[NonNegativeInt] = Field(
        description="activation memory one in-flight sample holds per layer, at TP 1")
    boundary_bytes_per_sample: list[NonNegativeInt] = Field(
        description="bytes of the layer's output activation per sample (what a stage boundary sends)")


class WorkloadSpec(Strict):
    """A training workload: what `models/NAME.json` holds, or an instance's inline workload."""

    name: str
    source: str = Field("", description="where the numbers come from")
    architecture: Architecture | None = None
    layer_bytes: LayerBytes | None = None
    profiles: list[Profile] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> "WorkloadSpec":
        if self.architecture is None and self.layer_bytes is None:
            if not self.profiles:
                raise ValueError("a workload needs an architecture, or profiles with layer_bytes")
        counts = set()
        if self.architecture is not None:
            counts.add(self.architecture.layers + 2)
        if self.layer_bytes is not None:
            lb = self.layer_bytes
            counts |= {len(lb.params), len(lb.activation_bytes_per_sample), len(lb.boundary_bytes_per_sample)}
        for profile in self.profiles:
            for per_tp in profile.times.values():
                for per_layer in per_tp.values():
                    counts.add(len(per_layer))
        if len(counts) > 1:
            raise ValueError(
                f"layer counts disagree (architecture layers + 2, layer_bytes and profiles): {sorted(counts)}")
        return self
