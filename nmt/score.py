"""python -m nmt.score hyp=PATH ref=PATH [lang=de] [output=results.json]

Primary: sacrebleu's detokenized, case-sensitive corpus BLEU with its signature, and chrF.
For comparison with the 2018 paper: Moses-tokenized BLEU (multi-bleu.perl's way, computed here with sacremoses and
sacrebleu on the tokens). For German targets only, hyphenated compounds are split first, the English-German
convention of tensor2tensor's get_ende_bleu.sh (`s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`): the record's key is then
`compound_split_bleu`. No source shows the paper's En-Fr figures split compounds, so every other target language
gets plain tokenized BLEU, recorded as `tokenized_bleu` (docs: DESIGN.md section 6).
"""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import OmegaConf
from sacrebleu.metrics import BLEU, CHRF

from nmt.cli import hydra_job
from nmt.config import ScoreJob
from nmt.compose import register_schemas
from nmt.data.readers import DataError, read_lines
from nmt.outputs import output_file, write_json

_COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(tokenized: str) -> str:
    """get_ende_bleu.sh's perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g' (non-overlapping, as in perl)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokenized)


SPLIT_LANGUAGES = ("de",)  # the compound split is get_ende_bleu.sh's, for German targets


def tokenized_bleu(hyps: list[str], refs: list[str], lang: str, split: bool | None = None) -> float:
    """BLEU on Moses tokens; hyphenated compounds split (##AT##-##AT##) when `split` (default: German targets)."""
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)
    split = lang in SPLIT_LANGUAGES if split is None else split

    def prepare(line: str) -> str:
        tokens = tokenizer.tokenize(line, return_str=True, escape=True)
        return split_compounds(tokens) if split else tokens

    return BLEU(tokenize="none", force=True).corpus_score([prepare(h) for h in hyps],
                                                          [[prepare(r) for r in refs]]).score


def compound_split_bleu(hyps: list[str], refs: list[str], lang: str) -> float:
    return tokenized_bleu(hyps, refs, lang, split=True)


def tokenized_key(lang: str) -> str:
    """The record's key for the tokenized BLEU of a target language: named by what it computes."""
    return "compound_split_bleu" if lang in SPLIT_LANGUAGES else "tokenized_bleu"


def tokenized_bleu_of(result: dict) -> float:
    """A record's tokenized BLEU, whichever of the two it holds."""
    return result["compound_split_bleu"] if "compound_split_bleu" in result else result["tokenized_bleu"]


def tokenized_label(lang: str) -> str:
    return ("compound-split tokenized BLEU (get_ende_bleu.sh)" if lang in SPLIT_LANGUAGES
            else "tokenized BLEU (no compound split)")


def score(hyps: list[str], refs: list[str], lang: str) -> dict:
    if len(hyps) != len(refs):
        raise DataError(f"{len(hyps)} hypotheses for {len(refs)} references: the files must be line-aligned")
    bleu, chrf = BLEU(), CHRF()
    bleu_result, chrf_result = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    return {
        "bleu": bleu_result.score,
        "signature": str(bleu.get_signature()),
        "bleu_line": str(bleu_result),
        "chrf": chrf_result.score,
        "chrf_signature": str(chrf.get_signature()),
        tokenized_key(lang): tokenized_bleu(hyps, refs, lang),
        "sentences": len(hyps),
    }


def score_files(hyp: str | Path, ref: str | Path, lang: str) -> dict:
    hyps, refs = list(read_lines(Path(hyp))), list(read_lines(Path(ref)))
    if len(hyps) != len(refs):
        raise DataError(f"{hyp} has {len(hyps)} lines, {ref} has {len(refs)}: they must be line-aligned")
    return {"hyp": str(hyp), "ref": str(ref), **score(hyps, refs, lang)}


register_schemas()


@hydra_job("score", ScoreJob)
def main(cfg) -> None:
    job: ScoreJob = OmegaConf.to_object(cfg)
    suffix = Path(job.ref).suffix.lstrip(".")
    lang = job.lang or (suffix if len(suffix) == 2 else "de")
    if job.output:  # before the scoring: a refusal costs nothing
        output_file("output", job.output, {"hyp file": job.hyp, "ref file": job.ref})
    result = score_files(job.hyp, job.ref, lang)
    print(f"sacreBLEU  {result['bleu_line']}")
    print(f"signature  {result['signature']}")
    print(f"chrF       {result['chrf']:.2f}  {result['chrf_signature']}")
    print(f"{tokenized_label(lang)}, for the 2018 paper: {tokenized_bleu_of(result):.2f}")
    if job.output:
        write_json(Path(job.output), result)


if __name__ == "__main__":
    main()
