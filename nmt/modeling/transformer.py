"""Encoder-decoder Transformer with relation-aware self-attention and an explicit decoding cache."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from nmt.config import ModelConfig
from nmt.data.vocab import BOS, EOS, PAD  # noqa: F401 (re-exported for decoding)
from nmt.kernels.cases import Case
from nmt.kernels.dispatch import AttentionBackend
from nmt.kernels.dropout import Dropout
from nmt.kernels.masks import attention_mask
from nmt.kernels.tiles import MAX_BUCKETS, buckets_block
from nmt.modeling.attention import KV, MultiHeadAttention
from nmt.modeling.edges import EdgeIndex
from nmt.modeling.positions import NO_POSITIONS, ALiBi, Rotary, StackPositions, T5Bias, input_positions
from nmt.modes import Norm, Position


class FeedForward(nn.Sequential):
    def __init__(self, d_model: int, ffn_dim: int, dropout: float):
        super().__init__(nn.Linear(d_model, ffn_dim), nn.ReLU(), Dropout(dropout), nn.Linear(ffn_dim, d_model))


class Sublayer(nn.Module):
    """Residual around a sublayer with pre- or post-LayerNorm and residual dropout."""

    def __init__(self, d_model: int, dropout: float, norm: Norm):
        super().__init__()
        self.norm, self.pre = nn.LayerNorm(d_model), norm == Norm.pre
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, fn) -> Tensor:
        if self.pre:
            return x + self.dropout(fn(self.norm(x)))
        return self.norm(x + self.dropout(fn(x)))


def self_attention_positions(cfg: ModelConfig, causal: bool) -> nn.Module | None:
    """The one switch over the self-attention schemes of nmt/modeling/positions.py: what a stack (encoder: causal=False)
    builds once per forward for its layers; None for the modes whose positions are edge tables or at the input."""
    if cfg.position == Position.t5:
        return T5Bias(cfg.heads, cfg.t5_buckets, cfg.t5_max_distance, causal)
    if cfg.position == Position.alibi:
        return ALiBi(cfg.heads, causal)
    if cfg.position == Position.rope:
        return Rotary(cfg.d_model // cfg.heads)
    return None


def stack_positions(scheme: nn.Module | None, x: Tensor, nk: int, q_offset: int,
                    key_padding_mask: Tensor | None = None) -> StackPositions:
    """scheme's positions for x (B, Nq, d) at q_offset.. against keys 0..nk-1, in the dtype attention runs in."""
    if scheme is None:
        return NO_POSITIONS
    kind = x.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
    return scheme(x.shape[1], nk, q_offset, key_padding_mask, x.device, dtype)


def edge_index(cfg: ModelConfig, causal: bool) -> EdgeIndex | None:
    """A stack's edge index (the decoder's: causal), built once for its layers; None for the modes without edge
    tables."""
    return EdgeIndex(cfg.clip, cfg.edge_buckets, causal) if cfg.position.edge_tables else None


def _self_attention(cfg: ModelConfig, backend: AttentionBackend | None, edges: EdgeIndex | None) -> MultiHeadAttention:
    return MultiHeadAttention(cfg.d_model, cfg.heads, cfg.dropout, edges, rel_key=cfg.rel_key, rel_value=cfg.rel_value,
                              share_heads=cfg.share_heads, backend=backend)


def model_cases(cfg: ModelConfig, dtype: torch.dtype, device: torch.device, training: bool) -> list[Case]:
    """Every case a Transformer's relative self-attention can meet: the encoder (padding) and the decoder
    (causal), each edge-window class its lengths can reach, with dropout (training) and without (evaluation,
    decoding), more and at most 16 queries."""
    if not Position(cfg.position).edge_tables or not (cfg.rel_key or cfg.rel_value):
        return []
    widest = min(2 * cfg.clip + 1, MAX_BUCKETS)
    blocks = sorted({buckets_block(r) for r in range(1, widest + 1)})
    d = cfg.d_model // cfg.heads
    cases = []
    for block in blocks:
        for causal in (False, True):
            for use_dropout in sorted({cfg.dropout > 0.0 and training, False}):
                for small in (False, True):  # at most 16 queries (decoding; short batches) take 16-row tiles
                    cases.append(Case(device.type, dtype, d, block, causal, use_dropout, cfg.rel_key, cfg.rel_value,
                                      cfg.share_heads, not causal, small))
    return cases


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend | None = None, edges: EdgeIndex | None = None):
        super().__init__()
        self.self_attn = _self_attention(cfg, backend, edges)
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.dropout)
        self.attn_block, self.ffn_block = (Sublayer(cfg.d_model, cfg.dropout, cfg.norm) for _ in range(2))

    def forward(self, x: Tensor, pad: Tensor, positions: StackPositions = NO_POSITIONS) -> Tensor:
        attn = self.self_attn
        x = self.attn_block(x, lambda h: attn(h, attn.project_kv(h, positions.rotation), key_padding_mask=pad,
                                              positions=positions))
        return self.ffn_block(x, self.ffn)


@dataclass
class LayerCache:
    """What one decoder layer keeps between steps: its own past K/V, and the source K/V."""

    self_kv: KV | None
    cross_kv: KV


@dataclass
class DecoderCache:
    """Target side: a row per hypothesis (B * K); source side (cross K/V, src_pad): a row per sentence (B), which
    its K hypotheses share."""

    layers: list[LayerCache]
    src_pad: Tensor  # (B, Ns) True = padding
    step: int = 0  # position of the next target token
    order: Tensor | None = None  # rows of the target side that the next step continues (a pending reorder)
    # cross-attention's padding as an additive bias, built once per batch when decoding (None: each layer builds it;
    # a default of None, not a StackPositions, lets torch.compile build the cache without a graph break)
    source_mask: StackPositions | None = None


def source_mask(src_pad: Tensor, dtype: torch.dtype) -> StackPositions:
    """Cross-attention's padding mask as the additive (B, 1, 1, Ns) bias that the attention core would build from
    src_pad at every layer and step (the same values, so the same logits), made once per batch; its empty rows only
    where a source is all padding."""
    mask, empty_rows = attention_mask(1, src_pad.shape[1], src_pad, False, 0, src_pad.device)
    bias = torch.zeros(mask.shape, dtype=dtype, device=src_pad.device).masked_fill(mask, torch.finfo(dtype).min)
    return StackPositions(bias=bias, empty_rows=empty_rows if bool(empty_rows.any()) else None)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend | None = None, edges: EdgeIndex | None = None):
        super().__init__()
        self.self_attn = _self_attention(cfg, backend, edges)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.dropout)  # never relative
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.dropout)
        self.blocks = nn.ModuleList(Sublayer(cfg.d_model, cfg.dropout, cfg.norm) for _ in range(3))

    def forward(self, x: Tensor, cache: LayerCache, src_pad: Tensor, step: int,
                positions: StackPositions = NO_POSITIONS, order: Tensor | None = None,
                source: StackPositions = NO_POSITIONS) -> tuple[Tensor, LayerCache]:
        """x (B, Nt, d) at positions step..step+Nt-1, continuing rows `order` of the cache (all when None);
        source: src_pad as a prebuilt bias (source_mask), NO_POSITIONS to build it here. Returns the output and the
        extended cache."""
        new_self_kv = None

        def self_attend(h):
            nonlocal new_self_kv
            q, kv = self.self_attn.project_qkv(h, positions.rotation)
            if cache.self_kv is not None:
                kv = cache.self_kv.extended(kv, order)
            new_self_kv = kv
            return self.self_attn(h, kv, causal=True, q_offset=step, positions=positions, q=q)

        def cross_attend(h):  # a sentence's hypotheses (beam search) are queries against its one source
            grouped = h.reshape(cache.cross_kv.k.shape[0], -1, h.shape[-1])  # (B, K * Nt, d): no positions here
            if source.bias is not None:
                return self.cross_attn(grouped, cache.cross_kv, positions=source).view_as(h)
            return self.cross_attn(grouped, cache.cross_kv, key_padding_mask=src_pad).view_as(h)

        x = self.blocks[0](x, self_attend)
        x = self.blocks[1](x, cross_attend)
        x = self.blocks[2](x, self.ffn)
        return x, LayerCache(new_self_kv, cache.cross_kv)


def tied_output(h: Tensor, embedding: Tensor) -> Tensor:
    """Logits over the vocabulary from the shared embedding matrix."""
    return h @ embedding.t()


class Transformer(nn.Module):
    """Shared source/target/output embedding over one joint vocabulary.

    backend: where relative self-attention may run the fused kernel (nmt/kernels/dispatch.py); None = PyTorch."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, backend: AttentionBackend | None = None,
                 recompute_layers: bool = False):
        super().__init__()
        self.cfg = cfg = cfg.check()
        self.embed = nn.Embedding(vocab_size, cfg.d_model, padding_idx=PAD)
        nn.init.normal_(self.embed.weight, 0.0, cfg.d_model**-0.5)
        nn.init.zeros_(self.embed.weight[PAD])
        self.embed_dropout = Dropout(cfg.dropout)
        self.output_linear = tied_output  # the output projection's GEMM (nmt.decoding.cpu_linear swaps it for decoding)
        edges = edge_index(cfg, causal=False)
        self.encoder = nn.ModuleList(EncoderLayer(cfg, backend, edges) for _ in range(cfg.encoder_layers))
        edges = edge_index(cfg, causal=True)
        self.decoder = nn.ModuleList(DecoderLayer(cfg, backend, edges) for _ in range(cfg.decoder_layers))
        pre = cfg.norm == Norm.pre  # pre-norm stacks end with a LayerNorm; post-norm already did
        self.encoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.encoder_positions, self.decoder_positions = input_positions(cfg)  # the tables added at the input
        # t5, alibi, rope: built once per forward for each stack's self-attention layers
        self.encoder_self_positions = self_attention_positions(cfg, causal=False)
        self.decoder_self_positions = self_attention_positions(cfg, causal=True)
        self.recompute_layers = recompute_layers  # train.checkpoint_activations: not the model's, nor saved with it

    def _layer(self, layer: nn.Module, *args):
        """layer(*args); with recompute_layers and autograd on, run again in the backward (RNG restored: same masks)."""
        if self.recompute_layers and torch.is_grad_enabled():
            return checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)

    def _embed(self, tokens: Tensor, offset: int = 0, side: str = "encoder") -> Tensor:
        x = self.embed(tokens) * math.sqrt(self.cfg.d_model)  # (B, N, d)
        positions = self.encoder_positions if side == "encoder" else self.decoder_positions
        if positions is not None:
            n = tokens.shape[1]
            if offset + n > self.cfg.max_positions:
                raise ValueError(f"sequence of {offset + n} tokens exceeds model.max_positions={self.cfg.max_positions}")
            x = x + positions.weight[offset : offset + n].to(x.dtype)
        return self.embed_dropout(x)

    def encode(self, src: Tensor) -> Tensor:
        """src (B, Ns) right-padded with PAD -> memory (B, Ns, d)."""
        pad = src.eq(PAD)
        x = self._embed(src)
        positions = stack_positions(self.encoder_self_positions, x, src.shape[1], 0, pad)
        for layer in self.encoder:
            x = self._layer(layer, x, pad, positions)
        return self.encoder_norm(x)

    def start(self, memory: Tensor, src: Tensor) -> DecoderCache:
        """Empty decoding cache: cross-attention K/V are projected once here (decoding: laid out contiguous, which
        every step reads, nmt.kernels.torch_attention.sdpa's path for few queries)."""
        kvs, pad = [layer.cross_attn.project_kv(memory) for layer in self.decoder], src.eq(PAD)
        if torch.is_grad_enabled() or torch.compiler.is_compiling():  # training: the mask as the layers build it
            return DecoderCache([LayerCache(None, kv) for kv in kvs], pad, 0)
        layers = [LayerCache(None, KV(kv.k.contiguous(), kv.v.contiguous())) for kv in kvs]
        kind = memory.device.type  # the bias takes the dtype of the queries it is added to
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else memory.dtype
        return DecoderCache(layers, pad, 0, source_mask=source_mask(pad, dtype))

    @property
    def output_weight(self) -> Tensor:
        """The output projection's matrix (V, d): the shared embedding."""
        return self.embed.weight

    def decode(self, tgt: Tensor, cache: DecoderCache, features_only: bool = False) -> tuple[Tensor, DecoderCache]:
        """Decode tgt (B, Nt) at positions cache.step.. -> logits (B, Nt, V) and the extended cache.

        Teacher forcing passes the whole shifted target with a fresh cache; incremental
        decoding passes one token at a time. The input cache is never modified. features_only: the decoder's output
        states (B, Nt, d) instead of the logits.
        """
        x = self._embed(tgt, cache.step, side="decoder")
        # one row per new token against every key so far: a step of incremental decoding builds (1, Nk), not a square
        positions = stack_positions(self.decoder_self_positions, x, cache.step + tgt.shape[1], cache.step)
        layers = []
        for layer, layer_cache in zip(self.decoder, cache.layers):
            x, layer_cache = self._layer(layer, x, layer_cache, cache.src_pad, cache.step, positions, cache.order,
                                         cache.source_mask or NO_POSITIONS)
            layers.append(layer_cache)
        x = self.decoder_norm(x)  # (B, Nt, d); below, the cache's order is applied (none pending)
        out = x if features_only else self.output_linear(x, self.output_weight)  # (B, Nt, V)
        return out, DecoderCache(layers, cache.src_pad, cache.step + tgt.shape[1], source_mask=cache.source_mask)

    @staticmethod
    def reorder(cache: DecoderCache, indices: Tensor, sentences: Tensor | None = None) -> DecoderCache:
        return reorder(cache, indices, sentences)

    def forward(self, src: Tensor, tgt_in: Tensor, features_only: bool = False) -> Tensor:
        """Teacher-forced logits (B, Nt, V); tgt_in starts with BOS and is right-padded. features_only: the decoder's
        output states (B, Nt, d) instead, which the training loss projects onto output_weight a chunk of tokens at a
        time (nmt/training/loss.py), so that no (B * Nt, V) logits exist at once."""
        memory = self.encode(src)
        out, _ = self.decode(tgt_in, self.start(memory, src), features_only)
        return out


def reorder(cache: DecoderCache, indices: Tensor, sentences: Tensor | None = None) -> DecoderCache:
    """Select hypothesis rows of the target side (beam search re-ranking within each sentence); sentences: also
    select these rows of the source side (sentences that leave or change places). Without it the source side is
    left as it is: a sentence's hypotheses share it, whatever their order. The target side's selection is recorded
    (composed with one still pending) and made by the next decode step's copy of the cache."""
    order = indices if cache.order is None else cache.order.index_select(0, indices)
    if sentences is None:
        return replace(cache, order=order)
    layers = [LayerCache(lc.self_kv, lc.cross_kv.index_select(sentences)) for lc in cache.layers]
    source = cache.source_mask
    if source is not None and source.bias is not None:
        empty = None if source.empty_rows is None else source.empty_rows.index_select(0, sentences)
        source = StackPositions(bias=source.bias.index_select(0, sentences), empty_rows=empty)
    return replace(cache, layers=layers, src_pad=cache.src_pad.index_select(0, sentences), order=order,
                   source_mask=source)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
