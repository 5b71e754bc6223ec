"""Encoder-decoder Transformer with relation-aware self-attention and an explicit decoding cache."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from nmt.attention import KV, MultiHeadAttention
from nmt.config import ModelConfig, Norm, Position
from nmt.data.vocab import BOS, EOS, PAD  # noqa: F401 (re-exported for decoding)
from nmt.kernels.dispatch import AttentionBackend


def sinusoids(n: int, d: int, offset: int = 0) -> Tensor:
    """Vaswani et al. 2017 sinusoidal encodings for positions offset..offset+n-1 -> (n, d)."""
    pos = torch.arange(offset, offset + n, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(n, d)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq[: d // 2])
    return table


class FeedForward(nn.Sequential):
    def __init__(self, d_model: int, ffn_dim: int, dropout: float):
        super().__init__(nn.Linear(d_model, ffn_dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn_dim, d_model))


class Sublayer(nn.Module):
    """Residual around a sublayer with pre- or post-LayerNorm and residual dropout."""

    def __init__(self, d_model: int, dropout: float, norm: Norm):
        super().__init__()
        self.norm, self.pre = nn.LayerNorm(d_model), norm == Norm.pre
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, fn) -> Tensor:
        if self.pre:
            return x + self.dropout(fn(self.norm(x)))
        return self.norm(x + self.dropout(fn(x)))


def _self_attention(cfg: ModelConfig, backend: AttentionBackend | None) -> MultiHeadAttention:
    relative = cfg.position in (Position.relative, Position.both)
    return MultiHeadAttention(
        cfg.d_model, cfg.heads, cfg.dropout, clip=cfg.clip if relative else None,
        rel_key=cfg.rel_key, rel_value=cfg.rel_value, share_heads=cfg.share_heads, backend=backend,
    )


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend | None = None):
        super().__init__()
        self.self_attn = _self_attention(cfg, backend)
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.dropout)
        self.attn_block, self.ffn_block = (Sublayer(cfg.d_model, cfg.dropout, cfg.norm) for _ in range(2))

    def forward(self, x: Tensor, pad: Tensor) -> Tensor:
        x = self.attn_block(x, lambda h: self.self_attn(h, self.self_attn.project_kv(h), key_padding_mask=pad))
        return self.ffn_block(x, self.ffn)


@dataclass
class LayerCache:
    """What one decoder layer keeps between steps: its own past K/V, and the source K/V."""

    self_kv: KV | None
    cross_kv: KV


@dataclass
class DecoderCache:
    layers: list[LayerCache]
    src_pad: Tensor  # (B, Ns) True = padding
    step: int = 0  # position of the next target token


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend | None = None):
        super().__init__()
        self.self_attn = _self_attention(cfg, backend)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.dropout)  # never relative
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.dropout)
        self.blocks = nn.ModuleList(Sublayer(cfg.d_model, cfg.dropout, cfg.norm) for _ in range(3))

    def forward(self, x: Tensor, cache: LayerCache, src_pad: Tensor, step: int) -> tuple[Tensor, LayerCache]:
        """x (B, Nt, d) at positions step..step+Nt-1; returns the output and the extended cache."""
        new_self_kv = None

        def self_attend(h):
            nonlocal new_self_kv
            kv = self.self_attn.project_kv(h)
            if cache.self_kv is not None:
                kv = KV(torch.cat([cache.self_kv.k, kv.k], 2), torch.cat([cache.self_kv.v, kv.v], 2))
            new_self_kv = kv
            return self.self_attn(h, kv, causal=True, q_offset=step)

        x = self.blocks[0](x, self_attend)
        x = self.blocks[1](x, lambda h: self.cross_attn(h, cache.cross_kv, key_padding_mask=src_pad))
        x = self.blocks[2](x, self.ffn)
        return x, LayerCache(new_self_kv, cache.cross_kv)


class Transformer(nn.Module):
    """Shared source/target/output embedding over one joint vocabulary.

    backend: where relative self-attention may run the fused kernel (nmt/kernels/dispatch.py); None = PyTorch."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, backend: AttentionBackend | None = None):
        super().__init__()
        self.cfg = cfg = cfg.check()
        self.embed = nn.Embedding(vocab_size, cfg.d_model, padding_idx=PAD)
        nn.init.normal_(self.embed.weight, 0.0, cfg.d_model**-0.5)
        nn.init.zeros_(self.embed.weight[PAD])
        self.embed_dropout = nn.Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg, backend) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg, backend) for _ in range(cfg.decoder_layers))
        pre = cfg.norm == Norm.pre  # pre-norm stacks end with a LayerNorm; post-norm already did
        self.encoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.absolute = cfg.position in (Position.absolute, Position.both, Position.learned)
        self.register_buffer("positions", sinusoids(cfg.max_positions, cfg.d_model), persistent=False)
        if cfg.position == Position.learned:  # fairseq's LearnedPositionalEmbedding: N(0, d^-0.5), not scaled
            self.encoder_positions, self.decoder_positions = (nn.Embedding(cfg.max_positions, cfg.d_model)
                                                              for _ in range(2))
            for table in (self.encoder_positions, self.decoder_positions):
                nn.init.normal_(table.weight, 0.0, cfg.d_model**-0.5)

    def _embed(self, tokens: Tensor, offset: int = 0, side: str = "encoder") -> Tensor:
        x = self.embed(tokens) * math.sqrt(self.cfg.d_model)  # (B, N, d)
        if self.absolute:
            n = tokens.shape[1]
            if offset + n > self.cfg.max_positions:
                raise ValueError(f"sequence of {offset + n} tokens exceeds model.max_positions={self.cfg.max_positions}")
            if self.cfg.position == Position.learned:
                table = getattr(self, f"{side}_positions").weight
            else:
                table = self.positions
            x = x + table[offset : offset + n].to(x.dtype)
        return self.embed_dropout(x)

    def encode(self, src: Tensor) -> Tensor:
        """src (B, Ns) right-padded with PAD -> memory (B, Ns, d)."""
        pad = src.eq(PAD)
        x = self._embed(src)
        for layer in self.encoder:
            x = layer(x, pad)
        return self.encoder_norm(x)

    def start(self, memory: Tensor, src: Tensor) -> DecoderCache:
        """Empty decoding cache: cross-attention K/V are projected once here."""
        layers = [LayerCache(None, layer.cross_attn.project_kv(memory)) for layer in self.decoder]
        return DecoderCache(layers, src.eq(PAD), 0)

    def decode(self, tgt: Tensor, cache: DecoderCache) -> tuple[Tensor, DecoderCache]:
        """Decode tgt (B, Nt) at positions cache.step.. -> logits (B, Nt, V) and the extended cache.

        Teacher forcing passes the whole shifted target with a fresh cache; incremental
        decoding passes one token at a time. The input cache is never modified.
        """
        x = self._embed(tgt, cache.step, side="decoder")
        layers = []
        for layer, layer_cache in zip(self.decoder, cache.layers):
            x, layer_cache = layer(x, layer_cache, cache.src_pad, cache.step)
            layers.append(layer_cache)
        logits = self.decoder_norm(x) @ self.embed.weight.t()  # (B, Nt, V)
        return logits, DecoderCache(layers, cache.src_pad, cache.step + tgt.shape[1])

    @staticmethod
    def reorder(cache: DecoderCache, indices: Tensor) -> DecoderCache:
        return reorder(cache, indices)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, Nt, V); tgt_in starts with BOS and is right-padded."""
        memory = self.encode(src)
        logits, _ = self.decode(tgt_in, self.start(memory, src))
        return logits


def reorder(cache: DecoderCache, indices: Tensor) -> DecoderCache:
    """Select rows of every cached tensor (beam search re-ranking): index_select along batch."""
    layers = [
        LayerCache(lc.self_kv.index_select(indices) if lc.self_kv is not None else None,
                   lc.cross_kv.index_select(indices))
        for lc in cache.layers
    ]
    return replace(cache, layers=layers, src_pad=cache.src_pad.index_select(0, indices))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
