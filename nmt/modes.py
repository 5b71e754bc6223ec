"""The switches of the schema (nmt/config.py): how positions enter the model, where LayerNorm sits, the precision,
the attention implementation, the learning-rate schedule. Each choice is a str enum, so an override writes its
value and a checkpoint stores it as text. Here too the rule on model.edge_buckets, which the schema and the edge
index both keep."""

from __future__ import annotations

import math
from enum import Enum


class Position(str, Enum):
    relative = "relative"  # Shaw et al. 2018: edge tables in self-attention, no sinusoids
    absolute = "absolute"  # Vaswani et al. 2017: sinusoids added to the embeddings
    both = "both"
    none = "none"  # no position information in the encoder at all (the paper's k=0 analogue)
    learned = "learned"  # learned absolute embeddings, one table each for encoder and decoder (BERT, fairseq's
    # --encoder-learned-pos): a row per position up to max_positions; rows past the longest training sentence stay
    # at their random initialization
    # Shaw's descendants, in self-attention only like relative (nothing at the input; nmt/modeling/positions.py):
    t5 = "t5"  # Raffel et al. 2020: a learned logit per (bucket of j - i, head), one table per stack
    alibi = "alibi"  # Press et al. 2022: the logit -m_h |i - j| (symmetric in the encoder), no parameters
    rope = "rope"  # Su et al. 2021: q and k rotated by position (interleaved pairs, base 10,000), no parameters

    @property
    def edge_tables(self) -> bool:
        """Shaw's edge tables a^K, a^V in self-attention (Eq. 3-4)."""
        return self in (Position.relative, Position.both)

    @property
    def input_table(self) -> bool:
        """A table of positions added to the embeddings (sinusoids or learned), which bounds the length by
        model.max_positions."""
        return self in (Position.absolute, Position.both, Position.learned)


class Norm(str, Enum):
    pre = "pre"  # LayerNorm before each sublayer, as tensor2tensor's transformer_base (2018)
    post = "post"  # LayerNorm after the residual add, as Vaswani et al. 2017


class Precision(str, Enum):
    auto = "auto"  # bf16 autocast on GPUs that support it, else fp16 with a GradScaler; fp32 on CPU
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class Stop(str, Enum):
    """When beam search ends a sentence, and how it ranks hypotheses of different lengths (nmt/decoding/search.py)."""

    exact = "exact"  # tensor2tensor's bound: once no live beam can still win under GNMT's penalty
    # ((5 + |Y|) / 6)^alpha at the longest allowed output: nothing the beam could still finish scores higher
    finished = "finished"  # fairseq's and CTranslate2's: once round(beam x patience) hypotheses have ended, ranked
    # by log p(Y|X) / |Y|^alpha (|Y| counts the end of sentence); fewer steps, and a live beam might have won


def hypotheses_to_end(beam: int, patience: float) -> int:
    """How many hypotheses end a sentence under Stop.finished: beam x patience rounded half away from zero, as
    CTranslate2's std::round (Python's round() takes 2.5 to 2)."""
    return math.floor(beam * patience + 0.5)


class Attention(str, Enum):
    """Which implementation runs relative self-attention (nmt/kernels/dispatch.py); RELNMT_ATTENTION stands in
    for auto when set."""

    auto = "auto"  # the fused Triton kernel on CUDA for each case that passed its self-test, else PyTorch
    torch = "torch"  # the PyTorch path everywhere
    triton = "triton"  # the kernel wherever its shapes fit, unchecked, no fallback (CPU: TRITON_INTERPRET=1)


class Schedule(str, Enum):
    inverse_sqrt = "inverse_sqrt"  # Vaswani et al. 2017 and the paper: warmup, then decay as step^-0.5
    linear = "linear"  # same warmup and peak, then linear decay to 0 at train.max_steps (short budgets)


class BestMetric(str, Enum):
    """What makes a validation the best so far (train.best_metric): checkpoint_best.pt and train.patience's count."""

    nll = "nll"  # the validation set's per-token negative log-likelihood: lower is better
    bleu = "bleu"  # greedy BLEU on the first train.valid_bleu_sentences validation sentences: higher is better


def bucket_rule(clip: int, buckets: int) -> str | None:
    """model.edge_buckets's rule (the schema checks it, nmt/modeling/edges.py's EdgeIndex keeps it): what is wrong
    with `buckets` log-spaced edge buckets up to k = clip, None when nothing: 0 (Shaw's clip), or an even N >= 4
    below 2k (at N/2 >= k T5's logarithm of k / (N/2) would be <= 0: garbage indices)."""
    if buckets == 0 or (buckets >= 4 and buckets % 2 == 0 and clip > buckets // 2):
        return None
    return (f"edge_buckets={buckets} must be even, >= 4 and below 2 x clip={clip} (k, where the logarithmic buckets "
            "end)")
