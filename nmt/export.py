"""python -m nmt.export checkpoint=PATH output=DIR [quantization=int8|int8_float32|float16|bfloat16|...] [force=true]

A relnmt checkpoint as a CTranslate2 model directory (model.bin, the vocabularies, config.json), with the
SentencePiece model beside it and TRANSLATE.md saying how to run it; `python -m nmt.translate checkpoint=DIR`
translates with it under the same contract as a relnmt checkpoint. The spec is built with CTranslate2's Python
spec API and maps this project's layout exactly: separate q/k/v projections fused into CTranslate2's qkv (self)
and kv (cross) matrices, one embedding for source, target and output, pre- or post-norm, embeddings scaled by
sqrt(d_model), queries by 1/sqrt(D). Position modes:

    absolute, learned, none  the table added at the input (relnmt's sinusoid table itself, a learned table, zeros)
    relative                 Shaw et al.'s tables per layer, shared across heads (model.share_heads=true); a table
                             that is off (rel_key or rel_value false) is exported as zeros, which adds nothing;
                             edge buckets (model.edge_buckets) as the 2k+1 distances' bucket vectors, the same a_ij
    t5                       T5's relative attention bias (one stack's table, given to each of its layers)
    rope                     rotary embeddings of the whole head dimension, interleaved pairs, base 10,000

CTranslate2 cannot hold per-head edge tables, ALiBi in an encoder, or sinusoids and edge tables together: those
are refused in one line (exit 2) saying why and what to train instead. An existing output folder is refused too,
unless it holds an earlier export and force=true is given; the new export replaces it in one step.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from nmt.cli import hydra_job
from nmt.config import ExportJob, ModelConfig
from nmt.compose import register_schemas
from nmt.data.vocab import BOS, EOS, UNK, Vocab
from nmt.decoding.decode import EXPORTED_CONFIG, load_translator
from nmt.errors import UserError
from nmt.modeling.positions import ROPE_BASE
from nmt.modeling.transformer import Transformer
from nmt.modes import Norm, Position
from nmt.outputs import remove_stale_temporaries, temporary_name

log = logging.getLogger("nmt.export")

SPM_FILE = "spm.model"  # beside model.bin: the exported directory tokenizes and detokenizes on its own


class NotExportable(UserError, ValueError):
    """A model CTranslate2 cannot hold: the message says why and what to train instead."""


def refusal(cfg: ModelConfig) -> str | None:
    """Why CTranslate2 cannot hold a model of this config, or None when it can."""
    if cfg.position == Position.relative and not cfg.share_heads:
        return ("CTranslate2 holds one edge table per layer, shared across heads, not one per head: train with "
                "model.share_heads=true (at tiny it costs no BLEU: results/README.md, the shared-table row)")
    if cfg.position == Position.alibi:
        return ("CTranslate2 has ALiBi only in a decoder, not in an encoder: train with model.position=t5 or rope "
                "for a relative scheme it can run")
    if cfg.position == Position.both:
        return ("CTranslate2 cannot hold sinusoids and edge tables together: train with model.position=relative "
                "(and model.share_heads=true) or absolute")
    return None


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()


def _linear(spec, *layers: torch.nn.Linear) -> None:
    """One CTranslate2 linear from one or more torch linears stacked on the output dimension (q;k;v, k;v)."""
    spec.weight = np.concatenate([_array(layer.weight) for layer in layers])
    spec.bias = np.concatenate([_array(layer.bias) for layer in layers])


def _layer_norm(spec, norm: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _attention(spec, attn, self_attention: bool, t5_table: torch.Tensor | None, t5_max_distance: int) -> None:
    if self_attention:
        _linear(spec.linear[0], attn.q_proj, attn.k_proj, attn.v_proj)
    else:
        _linear(spec.linear[0], attn.q_proj)
        _linear(spec.linear[1], attn.k_proj, attn.v_proj)
    _linear(spec.linear[-1], attn.out_proj)
    if hasattr(spec, "relative_position_keys"):
        zeros = np.zeros((2 * attn.edges.clip + 1, attn.d_head), np.float32)
        rel_k, rel_v = attn.clipped_tables()  # edge buckets: each distance's vector, exactly the same a_ij
        spec.relative_position_keys = zeros if rel_k is None else _array(rel_k)
        spec.relative_position_values = zeros if rel_v is None else _array(rel_v)
    if t5_table is not None:
        spec.relative_attention_bias = _array(t5_table.t())  # (buckets, heads), as T5's embedding
        spec.relative_attention_max_distance = np.dtype("int32").type(t5_max_distance)


def _inputs(spec, model: Transformer, side: str) -> None:
    """Embeddings, scaled by sqrt(d_model) like relnmt's, and the table added at the input where there is one."""
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings  # the encoder's: a list
    embeddings.weight = _array(model.embed.weight)
    spec.scale_embeddings = True
    if not hasattr(spec, "position_encodings"):  # relative, t5, rope: nothing at the input
        return
    table = getattr(model, f"{side}_positions")  # learned, or relnmt's own (interleaved) sinusoids, not CTranslate2's
    if table is None:  # none: CTranslate2 would add its sinusoids by default
        spec.position_encodings.encodings = np.zeros((model.cfg.max_positions, model.cfg.d_model), np.float32)
    else:
        spec.position_encodings.encodings = _array(table.weight)


def build_spec(model: Transformer, vocab: Vocab):
    """The CTranslate2 TransformerSpec of a relnmt model (refusal(model.cfg) must be None)."""
    from ctranslate2.specs import transformer_spec

    cfg = model.cfg
    kinds = dict(pre_norm=cfg.norm == Norm.pre, relative_position=cfg.position.edge_tables,
                 relative_attention_bias=cfg.position == Position.t5)
    if cfg.position == Position.rope:
        kinds.update(rotary_dim=0, rotary_interleave=True, rotary_base=ROPE_BASE)
    encoder = transformer_spec.TransformerEncoderSpec(cfg.encoder_layers, cfg.heads, **kinds)
    decoder = transformer_spec.TransformerDecoderSpec(cfg.decoder_layers, cfg.heads, **kinds)
    spec = transformer_spec.TransformerSpec(encoder, decoder)
    for side, stack_spec, layers, final_norm in (("encoder", encoder, model.encoder, model.encoder_norm),
                                                 ("decoder", decoder, model.decoder, model.decoder_norm)):
        _inputs(stack_spec, model, side)
        if hasattr(stack_spec, "layer_norm"):
            _layer_norm(stack_spec.layer_norm, final_norm)
        scheme = getattr(model, f"{side}_self_positions")
        t5_table = scheme.table if cfg.position == Position.t5 else None
        for layer_spec, layer in zip(stack_spec.layer, layers):
            _attention(layer_spec.self_attention, layer.self_attn, True, t5_table, cfg.t5_max_distance)
            norms = [layer.attn_block.norm, layer.ffn_block.norm] if side == "encoder" else \
                [block.norm for block in layer.blocks]
            _layer_norm(layer_spec.self_attention.layer_norm, norms[0])
            if side == "decoder":
                _attention(layer_spec.attention, layer.cross_attn, False, None, 0)
                _layer_norm(layer_spec.attention.layer_norm, norms[1])
            _layer_norm(layer_spec.ffn.layer_norm, norms[-1])
            _linear(layer_spec.ffn.linear_0, layer.ffn[0])
            _linear(layer_spec.ffn.linear_1, layer.ffn[3])
    decoder.projection.weight = _array(model.embed.weight)  # tied output embedding, no bias
    tokens = [vocab.sp.id_to_piece(i) for i in range(len(vocab))]
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    spec.config.add_source_eos = True  # relnmt's sources end with </s>
    spec.config.bos_token, spec.config.eos_token = tokens[BOS], tokens[EOS]
    spec.config.decoder_start_token, spec.config.unk_token = tokens[BOS], tokens[UNK]
    return spec


def export(checkpoint: str | Path, output: str | Path, quantization: str | None = None, force: bool = False) -> Path:
    """Write the CTranslate2 directory for a checkpoint; NotExportable when CTranslate2 cannot hold the model. An
    existing `output` is replaced only when it holds an earlier export and `force` is set, never another folder."""
    output = Path(output)
    check_output(output, force)  # before the work: a refusal costs nothing
    model, vocab = load_translator(checkpoint, torch.device("cpu"))
    why = refusal(model.cfg)
    if why is not None:
        raise NotExportable(f"{checkpoint}: model.position={model.cfg.position.value}"
                            f"{'' if model.cfg.share_heads else ', per-head tables'}: {why}")
    spec = build_spec(model, vocab)
    spec.validate()
    spec.optimize(quantization=quantization)
    remove_stale_temporaries(output)  # a killed export's staging folder
    staging = temporary_name(output)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        spec.save(str(staging))
        (staging / SPM_FILE).write_bytes(vocab.sp.serialized_model_proto())
        (staging / "TRANSLATE.md").write_text(usage(output, quantization))
        config = {"model": OmegaConf.to_container(OmegaConf.structured(model.cfg), enum_to_str=True),
                  "checkpoint": str(checkpoint), "quantization": quantization or "float32",
                  "files": {path.name: path.stat().st_size for path in sorted(staging.iterdir())}}
        (staging / EXPORTED_CONFIG).write_text(json.dumps(config, indent=2) + "\n")  # last: it marks it whole
    except BaseException:  # a full disk, Ctrl-C: nothing half-written left beside the output
        shutil.rmtree(staging, ignore_errors=True)
        raise
    swap_in(staging, output)
    return output


def check_output(output: Path, force: bool) -> None:
    """CTranslate2's converters' rule: an existing folder is not written over unless asked (force), and then only an
    export that nmt.export wrote; a folder of anything else (a run's checkpoints, the user's files) never."""
    if not output.exists() or (output.is_dir() and not any(output.iterdir())):
        return
    if not (output / EXPORTED_CONFIG).is_file():
        raise UserError(f"{output} exists and is not a model written by nmt.export: nothing was written; choose a new "
                        "folder for output=")
    if not force:
        raise UserError(f"{output} holds an earlier export: force=true replaces it (nothing was written)")


def swap_in(staging: Path, output: Path) -> None:
    """staging takes output's name, so that a kill at any moment leaves the old export or the new one there, whole:
    an atomic exchange of the two folders where the system has one (Linux renameat2), else the old one moved aside
    first (a kill between the two renames leaves both, whole, beside the name)."""
    if not output.exists():
        staging.rename(output)
        return
    if not exchange(staging, output):
        aside = output.with_name(f".{output.name}.old")
        shutil.rmtree(aside, ignore_errors=True)
        output.rename(aside)
        staging.rename(output)
        staging = aside
    shutil.rmtree(staging)  # the old export, now out of the way


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (renameat2 RENAME_EXCHANGE); False where the system or file system has none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_cwd, rename_exchange = -100, 2  # AT_FDCWD, RENAME_EXCHANGE (linux/fs.h)
    return renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), rename_exchange) == 0


def usage(output: Path, quantization: str | None) -> str:
    return f"""# A relnmt model exported to CTranslate2 ({quantization or 'float32 weights'})

With relnmt (same command-line contract as a checkpoint: one line out per line in, streamed):

    python -m nmt.translate checkpoint={output} input=test.en output=test.hyp

With CTranslate2 alone (pip install ctranslate2 sentencepiece):

    import ctranslate2, sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file="{output}/{SPM_FILE}")
    translator = ctranslate2.Translator("{output}", device="cpu")  # or "cuda"
    pieces = sp.encode(["A man rides a bike."], out_type=str)
    results = translator.translate_batch(pieces, beam_size=4, length_penalty=0.6, min_decoding_length=1)
    print(sp.decode(results[0].hypotheses[0]))

The source end-of-sentence token is added by the model (add_source_eos). CTranslate2's length penalty divides by
length^alpha; relnmt's (GNMT) by ((5 + length) / 6)^alpha: at alpha = 0 the two searches are the same.
"""


register_schemas()


@hydra_job("export", ExportJob)
def main(cfg) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s", force=True)
    job: ExportJob = OmegaConf.to_object(cfg)
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise UserError("the export needs CTranslate2: pip install -e '.[deploy]' (or pip install ctranslate2)"
                        ) from None
    path = export(job.check().checkpoint, job.output, job.quantization, job.force)
    log.info("wrote %s (translate with: python -m nmt.translate checkpoint=%s)", path, path)


if __name__ == "__main__":
    main()
