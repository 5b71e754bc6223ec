"""python -m nmt.score hyp=PATH ref=PATH [lang=de] [output=results.json]

Primary: sacrebleu's detokenized, case-sensitive corpus BLEU with its signature, and chrF.
For comparison with the 2018 paper: tokenized BLEU with compound splitting, the convention of
tensor2tensor's get_ende_bleu.sh (Moses tokenizer, `s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`,
multi-bleu.perl), computed here with sacremoses and sacrebleu on the tokens.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from omegaconf import OmegaConf
from sacrebleu.metrics import BLEU, CHRF

from nmt.cli import hydra_job
from nmt.config import ScoreJob, register_schemas
from nmt.data.readers import DataError, read_lines
from nmt.outputs import output_file

_COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(tokenized: str) -> str:
    """get_ende_bleu.sh's perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g' (non-overlapping, as in perl)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokenized)


def compound_split_bleu(hyps: list[str], refs: list[str], lang: str) -> float:
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)

    def prepare(line: str) -> str:
        return split_compounds(tokenizer.tokenize(line, return_str=True, escape=True))

    return BLEU(tokenize="none", force=True).corpus_score([prepare(h) for h in hyps], [[prepare(r) for r in refs]]).score


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
        "compound_split_bleu": compound_split_bleu(hyps, refs, lang),
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
    print(f"compound-split tokenized BLEU (comparable to the 2018 paper): {result['compound_split_bleu']:.2f}")
    if job.output:
        Path(job.output).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
