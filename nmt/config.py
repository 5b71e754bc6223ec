"""Structured config schemas. YAML presets under configs/ only select and override these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING

from nmt.errors import ConfigError, require  # noqa: F401 -- ConfigError: its home for the schema's users
from nmt.modes import Attention, BestMetric, Norm, Position, Precision, Schedule, Stop, bucket_rule, hypotheses_to_end
from nmt.roles import defines, extends, places, scores


def valid_device(name: str) -> bool:
    """auto | cpu | cuda | cuda:N (resolved by nmt.runtime.process.resolve_device)."""
    return name in ("auto", "cpu", "cuda") or (name.startswith("cuda:") and name[5:].isdigit())


@dataclass
class ModelConfig:
    encoder_layers: int = 6  # encoder layers (N)
    decoder_layers: int = 6  # decoder layers (N)
    d_model: int = 512  # model width: embeddings and every sublayer's output
    heads: int = 8  # attention heads (d_model / heads per head)
    ffn_dim: int = 1024  # the feed-forward sublayer's hidden width
    dropout: float = defines(0.1)  # embeddings, residuals, attention probabilities and FFN hidden
    position: Position = Position.relative  # how positions enter: Shaw's edge tables, sinusoids, ...
    # clip, rel_key, rel_value, share_heads: the edge tables of position=relative|both; other modes ignore them
    clip: int = 16  # k: relative distances are clipped to [-k, k]
    rel_key: bool = True  # a^K (Eq. 4)
    rel_value: bool = True  # a^V (Eq. 3)
    share_heads: bool = False  # one edge table per layer (big) instead of per layer and head (base)
    edge_buckets: int = 0  # 0 = Shaw's clip to [-k, k]; N = N log-spaced buckets of j - i up to model.clip
    t5_buckets: int = 32  # position=t5: buckets of j - i (each direction gets half in the encoder), as T5
    t5_max_distance: int = 128  # position=t5: distances from here on share the last bucket, as T5
    norm: Norm = Norm.pre  # LayerNorm before each sublayer (pre) or after its residual add (post)
    max_positions: int = 1024  # longest sequence the position table covers (absolute, both, learned)

    def check(self) -> "ModelConfig":
        """Self with enum fields as enums, after checking every value (ConfigError names the field)."""
        self.position, self.norm = Position(self.position), Norm(self.norm)
        require(self.encoder_layers >= 1 and self.decoder_layers >= 1, "model.encoder_layers/decoder_layers",
                (self.encoder_layers, self.decoder_layers), ">= 1")
        require(self.heads >= 1, "model.heads", self.heads, ">= 1")
        require(self.d_model >= 1 and self.d_model % self.heads == 0, "model.d_model", self.d_model,
                f"a positive multiple of model.heads={self.heads}")
        require(self.ffn_dim >= 1, "model.ffn_dim", self.ffn_dim, ">= 1")
        require(0.0 <= self.dropout < 1.0, "model.dropout", self.dropout, "in [0, 1)")
        require(self.clip >= 0, "model.clip", self.clip, ">= 0")
        if self.edge_buckets:  # a form of position=relative; the rule on its sizes: nmt.modes
            require(self.position == Position.relative and bucket_rule(self.clip, self.edge_buckets) is None,
                    "model.edge_buckets", self.edge_buckets, f"0, or with position=relative (here {self.position.value})"
                    f" an even number >= 4 below 2 x model.clip={self.clip} (k, where the logarithmic buckets end)")
        require(self.max_positions >= 1, "model.max_positions", self.max_positions, ">= 1")
        require(self.t5_buckets >= 4 and self.t5_buckets % 2 == 0, "model.t5_buckets", self.t5_buckets,
                "an even number >= 4 (the encoder splits them between the two directions)")
        require(self.t5_max_distance > self.t5_buckets // 2, "model.t5_max_distance", self.t5_max_distance,
                f"> model.t5_buckets / 2 = {self.t5_buckets // 2} (where the logarithmic buckets begin)")
        if self.position == Position.rope:
            require((self.d_model // self.heads) % 2 == 0, "model.d_model", self.d_model,
                    f"a multiple of 2 x model.heads={self.heads} for position=rope (it rotates pairs of dimensions)")
        return self


def model_config_from_dict(fields: dict) -> ModelConfig:
    """ModelConfig from the plain dict stored in a checkpoint."""
    fields = dict(fields)
    for name, value in (fields.pop("attention", None) or {}).items():  # checkpoints from before 0.2
        if value is not None:
            fields[name] = value
    return ModelConfig(**fields).check()


@dataclass
class DataConfig:
    name: str = MISSING  # multi30k | wmt14 | local
    src: str = "en"  # source language: file suffix and the pair's first half
    tgt: str = "de"  # target language
    # data=local: file prefixes, read as PREFIX.<src> and PREFIX.<tgt> (plain or .gz)
    train: Optional[str] = places(None)  # data=local: training files' prefix
    valid: Optional[str] = places(None)  # data=local: validation files' prefix
    test: Optional[str] = places(None)  # data=local: test files' prefix (the local preset asks for it: the test set)
    # data=multi30k: folder with {train,val,test_2016_flickr}.<lang>.gz
    root: str = places("data/multi30k")  # data=multi30k: the folder of its .gz files
    # data=wmt14: Hugging Face hub dataset and config
    hub_name: str = places("wmt/wmt14")  # data=wmt14: the Hugging Face hub dataset
    hub_config: Optional[str] = None  # data=wmt14: the dataset config (de-en, fr-en)
    vocab_size: int = 8000  # shared SentencePiece vocabulary size (WMT14 and local presets: 32,768)
    vocab_sample: int = 4_000_000  # sentences SentencePiece learns from (a sample drawn with a fixed seed)
    # A vocabulary to reuse instead of learning one (fine-tuning on another corpus): vocab_size and vocab_sample unread
    vocab_from: Optional[str] = None  # a prepared folder, its spm.model, or a checkpoint whose vocabulary to keep
    max_len: int = 250  # training pairs longer than this (subword tokens, either side) are dropped
    max_ratio: float = 1.5  # training pairs whose token-length ratio exceeds this are dropped
    max_src_words: int = 0  # training pairs whose source has more words are dropped (0 = no cap; length study)
    prepared_dir: Optional[str] = places(None)  # default: prepared/<name>_<src>_<tgt> (+ _src<N>w with max_src_words)
    chunk_lines: int = places(10_000)  # pairs encoded per chunk (a worker's task): memory is 2 chunks per worker
    workers: int = places(0)  # processes that encode and binarize (0 = one per core); the same bytes on any number

    def check(self) -> "DataConfig":
        require(self.src != self.tgt, "data.tgt", self.tgt, f"a language other than data.src={self.src}")
        require(self.vocab_size >= 16, "data.vocab_size", self.vocab_size, ">= 16")
        require(self.vocab_sample > 100, "data.vocab_sample", self.vocab_sample, "> 100 (SentencePiece's own floor)")
        require(self.max_len >= 1, "data.max_len", self.max_len, ">= 1")
        require(self.max_ratio >= 1.0, "data.max_ratio", self.max_ratio, ">= 1")
        require(self.max_src_words >= 0, "data.max_src_words", self.max_src_words, ">= 0 (0 = no cap)")
        require(self.chunk_lines >= 1, "data.chunk_lines", self.chunk_lines, ">= 1")
        require(self.workers >= 0, "data.workers", self.workers, ">= 0 (0 = every core)")
        return self


@dataclass
class OptimConfig:
    """Adam with the inverse-square-root schedule of Vaswani et al. 2017 (or a linear decay for short runs)."""

    lr_scale: float = 1.0  # lr = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    warmup: int = 4000  # updates of linear warmup; the peak rate is d_model^-0.5 * warmup^-0.5
    schedule: Schedule = Schedule.inverse_sqrt  # the rate after warmup
    beta1: float = 0.9  # Adam's beta1
    beta2: float = 0.98  # Adam's beta2
    eps: float = 1e-9  # Adam's epsilon
    label_smoothing: float = 0.1  # epsilon_ls of the label-smoothed loss
    clip_norm: float = 0.0  # 0 = no clipping (the paper's recipe); the norm is logged either way
    # The T5 tables are a few hundred scalars that the shared schedule moves by about one logit in a 600-update run.
    bias_lr_scale: float = 1.0  # position=t5: its bias tables' learning rate over the rest's (1 = the same)

    def check(self) -> "OptimConfig":
        self.schedule = Schedule(self.schedule)
        require(self.lr_scale > 0, "optim.lr_scale", self.lr_scale, "> 0")
        require(self.warmup >= 1, "optim.warmup", self.warmup, ">= 1")
        require(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "optim.beta1/beta2", (self.beta1, self.beta2),
                "in [0, 1)")
        require(self.eps > 0, "optim.eps", self.eps, "> 0")
        require(0 <= self.label_smoothing < 1, "optim.label_smoothing", self.label_smoothing, "in [0, 1)")
        require(self.clip_norm >= 0, "optim.clip_norm", self.clip_norm, ">= 0 (0 = no clipping)")
        require(self.bias_lr_scale > 0, "optim.bias_lr_scale", self.bias_lr_scale, "> 0")
        return self


@dataclass
class TrainConfig:
    max_steps: int = extends(100_000)  # optimizer updates
    max_minutes: float = extends(0.0)  # wall-clock budget, 0 = none; whichever of the two comes first stops
    max_tokens: int = 4096  # padded tokens (longer side) per device per micro-batch
    # The trainer derives the accumulation from it (nmt/batch.py), so every launch form trains the same batch.
    tokens_per_update: int = places(0)  # the recipe's batch: padded tokens per update, all devices (0: W x max_tokens x F)
    update_freq: Optional[int] = places(None)  # micro-batches per update per device; null = derived (1 with no stated batch)
    save_every_steps: int = places(1000)  # a checkpoint every N updates (the save cadence)
    save_every_minutes: float = places(0.0)  # 0 = off; the paper's big model saves every 10 minutes
    keep_last: int = places(20)  # numbered checkpoints kept (older ones deleted); 0 = all
    average_last: int = 0  # at the end, average the last N checkpoints into output_dir/averaged.pt
    seed: int = 1  # initialization, dropout and data order
    output_dir: str = places("${run_dir:}")  # checkpoints, logs; default outputs/<model>_<data>[.overrides]
    device: str = places("auto")  # auto | cpu | cuda | cuda:N (under torchrun: cuda, each rank its own)
    precision: Precision = Precision.auto  # mixed precision (auto: bf16 or fp16 on a GPU, fp32 on a CPU)
    log_every: int = places(100)  # a log line (and TensorBoard scalars) every N updates
    valid_every: int = 1000  # validation loss (and greedy BLEU on valid_bleu_sentences) every N updates
    valid_bleu_sentences: int = 200  # 0 = no validation BLEU
    best_metric: BestMetric = BestMetric.nll  # what keeps output_dir/checkpoint_best.pt: nll (lower) or bleu (higher)
    patience: int = 0  # stop after this many validations in a row without a better best_metric; 0 = never early
    init_from: Optional[str] = None  # fine-tuning: a checkpoint whose weights start a new run (optimizer, step afresh)
    max_bad_updates: int = places(10)  # updates in a row skipped for a non-finite loss or gradient before the run stops
    threads: int = places(0)  # CPU threads per process; 0 = cores / local processes
    compile: Optional[bool] = places(None)  # torch.compile the model for training (dynamic shapes); null = on for CUDA only
    deterministic: bool = places(False)  # CUDA's deterministic algorithms and cuBLAS workspace: same bits on a GPU (slower)
    attention: Attention = places(Attention.auto)  # relative self-attention's implementation (auto | torch | triton)
    loss_chunk_tokens: int = places(1024)  # output layer and loss on this many tokens at a time, never whole logits; 0 = off
    checkpoint_activations: bool = places(False)  # recompute each layer in the backward: same gradients, less memory
    score_split: str = scores("valid")  # a -m sweep cell ends decoding (beam 4, alpha 0.6) and scoring this: valid | test
    score_lines: int = scores(0)  # a sweep cell scores only the first N sentences of its split (0 = all)
    score: bool = places(False)  # end in a record: decode and score score_split into result.json (a -m cell always)
    dry_run: bool = places(False)  # print the job, its batch, parameters and a time estimate from a few timed updates; no run

    def check(self) -> "TrainConfig":
        self.precision, self.attention = Precision(self.precision), Attention(self.attention)
        self.best_metric = BestMetric(self.best_metric)
        for name in ("max_steps", "max_tokens", "save_every_steps", "log_every", "max_bad_updates"):
            require(getattr(self, name) >= 1, f"train.{name}", getattr(self, name), ">= 1")
        require(self.update_freq is None or self.update_freq >= 1, "train.update_freq", self.update_freq,
                ">= 1 or null (derived from train.tokens_per_update)")
        for name in ("max_minutes", "save_every_minutes", "keep_last", "average_last", "valid_every",
                     "valid_bleu_sentences", "threads", "tokens_per_update", "score_lines", "patience",
                     "loss_chunk_tokens"):
            require(getattr(self, name) >= 0, f"train.{name}", getattr(self, name), ">= 0")
        require(self.keep_last == 0 or self.average_last <= self.keep_last, "train.average_last",
                self.average_last, f"<= train.keep_last={self.keep_last} (older checkpoints are deleted)")
        require(valid_device(self.device), "train.device", self.device, "auto, cpu, cuda or cuda:N")
        require(self.score_split in ("test", "valid"), "train.score_split", self.score_split, "test or valid")
        require(self.patience == 0 or self.valid_every > 0, "train.patience", self.patience,
                "0 with train.valid_every=0")
        require(self.best_metric != BestMetric.bleu or self.valid_bleu_sentences > 0, "train.best_metric", "bleu",
                "nll with train.valid_bleu_sentences=0 (no BLEU to compare)")
        return self


@dataclass
class TrainJob:
    model: ModelConfig = MISSING  # the Transformer
    data: DataConfig = MISSING  # the corpus, its vocabulary and filters (prepared on the first run)
    optim: OptimConfig = field(default_factory=OptimConfig)  # Adam and the learning-rate schedule
    train: TrainConfig = field(default_factory=TrainConfig)  # the run: budget, batch, checkpoints, device

    def check(self) -> "TrainJob":
        self.model.check(), self.data.check(), self.optim.check(), self.train.check()
        require(self.optim.bias_lr_scale == 1.0 or self.model.position == Position.t5, "optim.bias_lr_scale",
                self.optim.bias_lr_scale, f"1 with model.position={self.model.position.value} (it scales T5's bias "
                "tables: model.position=t5)")
        return self


@dataclass
class PrepareJob:
    data: DataConfig = MISSING  # the corpus, its vocabulary and filters
    force: bool = False  # rebuild even when the manifest says the prepared data is up to date


@dataclass
class SearchConfig:
    """How sentences are decoded: nmt.translate's options, validation BLEU's (beam 1) and the experiments'."""

    beam: int = 4  # 1 = greedy
    alpha: float = 0.6  # GNMT length penalty exponent (stop=finished: the exponent of |Y|^alpha instead)
    stop: Stop = Stop.exact  # exact: no live beam can still win (tensor2tensor's); finished: CTranslate2's, fairseq's
    patience: float = 1.0  # stop=finished: a sentence ends once round(beam x patience) hypotheses have ended
    max_extra: int = 50  # longest output = source length + max_extra
    min_length: int = 1  # no end of sentence before this many tokens (1: no empty translation of a non-empty line)
    max_tokens: int = 4096  # padded source tokens per batch (each expanded to `beam` hypotheses)
    max_input_tokens: int = 1024  # longer input lines are cut to this many subword tokens, with a warning

    def check(self) -> "SearchConfig":
        require(self.beam >= 1, "beam", self.beam, ">= 1 (1 = greedy)")
        require(self.alpha >= 0, "alpha", self.alpha, ">= 0 (0 = no length penalty)")
        require(hypotheses_to_end(self.beam, self.patience) >= 1 and (self.patience == 1 or self.stop == Stop.finished),
                "patience", self.patience, f"1.0 unless stop=finished, with round(beam={self.beam} x patience) >= 1")
        require(self.max_extra >= 1, "max_extra", self.max_extra, ">= 1")
        require(0 <= self.min_length <= self.max_extra, "min_length", self.min_length, f"in [0, {self.max_extra}]")
        require(self.max_tokens >= 1, "max_tokens", self.max_tokens, ">= 1")
        require(self.max_input_tokens >= 1, "max_input_tokens", self.max_input_tokens, ">= 1")
        return self


@dataclass
class DecodeJob(SearchConfig):
    checkpoint: str = MISSING  # a relnmt checkpoint (averaged.pt), or a folder nmt.export wrote
    input: Optional[str] = None  # the file to translate, one sentence per line (plain or .gz); default: stdin
    output: Optional[str] = None  # the translations, one line per input line; default: stdout
    buffer_lines: int = 5000  # input lines read, translated (length-sorted) and written at a time: bounds memory
    nbest: int = 1  # > 1: that many translations per line with their scores ("INDEX ||| TRANSLATION ||| SCORE"); <= beam
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 0  # CPU threads (0: torch's default, OMP_NUM_THREADS or every core); a CTranslate2 model's too
    precision: Precision = Precision.auto  # auto: bf16 autocast on a GPU that has it, else fp32
    attention: Attention = Attention.auto  # relative self-attention's implementation (auto | torch | triton)

    def check(self) -> "DecodeJob":
        super().check()
        require(valid_device(self.device), "device", self.device, "auto, cpu, cuda or cuda:N")
        require(self.buffer_lines >= 1, "buffer_lines", self.buffer_lines, ">= 1")
        require(self.threads >= 0, "threads", self.threads, ">= 0 (0: torch's default)")
        most = self.beam if self.stop == Stop.exact else min(self.beam, hypotheses_to_end(self.beam, self.patience))
        require(1 <= self.nbest <= most, "nbest", self.nbest, f"in [1, {most}] (beam, or round(beam x patience))")
        self.precision, self.attention = Precision(self.precision), Attention(self.attention)
        return self


QUANTIZATIONS = ("float32", "float16", "bfloat16", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16")


@dataclass
class ExportJob:
    checkpoint: str = MISSING  # a relnmt checkpoint (averaged.pt, checkpoint_*.pt)
    output: str = MISSING  # the CTranslate2 model directory to write: a new or empty folder, or see force
    quantization: Optional[str] = None  # CTranslate2's weight type: float32 (default), int8, float16, ...
    force: bool = False  # replace an earlier export in output (never a folder that nmt.export did not write)

    def check(self) -> "ExportJob":
        require(self.quantization is None or self.quantization in QUANTIZATIONS, "quantization", self.quantization,
                "one of " + ", ".join(QUANTIZATIONS))
        return self


@dataclass
class AverageJob:
    directory: str = MISSING  # a training output folder holding checkpoint_<update>.pt files
    last: int = MISSING  # how many of its newest regular checkpoints to average (a signal's stop-time save is left out)
    output: Optional[str] = None  # the averaged checkpoint to write; default: <directory>/averaged.pt

    def check(self) -> "AverageJob":
        require(self.last >= 1, "last", self.last, ">= 1")
        return self


@dataclass
class ScoreJob:
    hyp: str = MISSING  # the translations (detokenized), one line per line of ref
    ref: str = MISSING  # the reference translations
    lang: Optional[str] = None  # target language for the Moses tokenizer; default: the ref file's suffix, else "de"
    output: Optional[str] = None  # also write the results as JSON here


SECTIONS = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig, "train": TrainConfig}  # a TrainJob's
