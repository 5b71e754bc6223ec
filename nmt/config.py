"""Structured config schemas. YAML presets under configs/ only select and override these."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

from omegaconf import MISSING


class Position(str, Enum):
    relative = "relative"  # Shaw et al. 2018: edge tables in self-attention, no sinusoids
    absolute = "absolute"  # Vaswani et al. 2017: sinusoids added to the embeddings
    both = "both"
    none = "none"  # no position information in the encoder at all (the paper's k=0 analogue)


class Norm(str, Enum):
    pre = "pre"  # LayerNorm before each sublayer, as tensor2tensor's transformer_base (2018)
    post = "post"  # LayerNorm after the residual add, as Vaswani et al. 2017


@dataclass
class AttentionAliases:
    """`model.attention.clip=...` as written in DESIGN §4's sweep examples; null = use model.clip etc."""

    clip: Optional[int] = None
    rel_key: Optional[bool] = None
    rel_value: Optional[bool] = None
    share_heads: Optional[bool] = None


@dataclass
class ModelConfig:
    encoder_layers: int = 6
    decoder_layers: int = 6
    d_model: int = 512
    heads: int = 8
    ffn_dim: int = 1024
    dropout: float = 0.1  # embeddings, residuals, attention probabilities and FFN hidden
    position: Position = Position.relative
    clip: int = 16  # k: relative distances are clipped to [-k, k]
    rel_key: bool = True  # a^K (Eq. 4)
    rel_value: bool = True  # a^V (Eq. 3)
    share_heads: bool = False  # one edge table per layer (big) instead of per layer and head (base)
    norm: Norm = Norm.pre
    max_positions: int = 1024  # longest sequence the sinusoid table covers (absolute/both)
    attention: AttentionAliases = field(default_factory=AttentionAliases)

    def resolved(self) -> "ModelConfig":
        """Copy with `attention.*` aliases folded into the top-level fields."""
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "attention"}
        for name in ("clip", "rel_key", "rel_value", "share_heads"):
            alias = getattr(self.attention, name)
            if alias is not None:
                fields[name] = alias
        fields["position"] = Position(fields["position"])
        fields["norm"] = Norm(fields["norm"])
        if fields["clip"] < 0:
            raise ValueError(f"model.clip must be >= 0, got {fields['clip']}")
        return ModelConfig(**fields)


def model_config_from_dict(fields: dict) -> ModelConfig:
    """ModelConfig from the plain dict stored in a checkpoint."""
    fields = dict(fields)
    fields["attention"] = AttentionAliases(**fields.get("attention", {}))
    return ModelConfig(**fields).resolved()


@dataclass
class DataConfig:
    name: str = MISSING  # multi30k | wmt14 | local
    src: str = "en"
    tgt: str = "de"
    # data=local: file prefixes, read as PREFIX.<src> and PREFIX.<tgt> (plain or .gz)
    train: Optional[str] = None
    valid: Optional[str] = None
    test: Optional[str] = None
    # data=multi30k: folder with {train,val,test_2016_flickr}.<lang>.gz
    root: str = "data/multi30k"
    # data=wmt14: Hugging Face hub dataset and config
    hub_name: str = "wmt/wmt14"
    hub_config: Optional[str] = None
    vocab_size: int = 8000
    vocab_sample: int = 4_000_000  # sentences sampled to train SentencePiece (input_sentence_size)
    max_len: int = 250  # training pairs longer than this (subword tokens, either side) are dropped
    max_ratio: float = 1.5  # training pairs whose token-length ratio exceeds this are dropped
    prepared_dir: Optional[str] = None  # default: prepared/<src>-<tgt>.<name>
    chunk_lines: int = 100_000  # lines encoded per chunk: bounds prepare's memory on WMT14


class Precision(str, Enum):
    auto = "auto"  # bf16 autocast on GPUs that support it, else fp16 with a GradScaler; fp32 on CPU
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


@dataclass
class OptimConfig:
    """Adam with the inverse-square-root schedule of Vaswani et al. 2017."""

    lr_scale: float = 1.0  # lr = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    warmup: int = 4000
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-9
    label_smoothing: float = 0.1
    clip_norm: float = 0.0  # 0 = no clipping (the paper's recipe); the norm is logged either way


@dataclass
class TrainConfig:
    max_steps: int = 100_000  # optimizer updates
    max_minutes: float = 0.0  # wall-clock budget, 0 = none; whichever of the two comes first stops
    max_tokens: int = 4096  # padded tokens (longer side) per device per micro-batch
    update_freq: int = 1  # micro-batches accumulated per update (1 GPU reaches the 8-GPU batch with 8)
    save_every_steps: int = 1000
    save_every_minutes: float = 0.0  # 0 = off; the paper's big model saves every 10 minutes
    keep_last: int = 20
    average_last: int = 0  # at the end, average the last N checkpoints into output_dir/averaged.pt
    seed: int = 1
    output_dir: str = "${hydra:runtime.output_dir}"
    device: str = "auto"  # auto | cpu | cuda
    precision: Precision = Precision.auto
    log_every: int = 100
    valid_every: int = 1000  # validation loss (and greedy BLEU on valid_bleu_sentences) every N updates
    valid_bleu_sentences: int = 200  # 0 = no validation BLEU
    max_bad_updates: int = 10  # consecutive non-finite losses before the run stops
    threads: int = 0  # CPU threads per process; 0 = cores / local processes


@dataclass
class TrainJob:
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


@dataclass
class PrepareJob:
    data: DataConfig = MISSING
    force: bool = False  # rebuild even when the manifest says the prepared data is up to date


def register_schemas() -> None:
    """Make the dataclasses the base of configs/*.yaml, so a typo in an override is an error."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="prepare_schema", node=PrepareJob)
    store.store(name="train_schema", node=TrainJob)
    store.store(group="model", name="schema", node=ModelConfig)
    store.store(group="data", name="schema", node=DataConfig)
