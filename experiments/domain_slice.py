"""An in-domain corpus cut from the bundled Multi30k, for the fine-tuning example (docs/configuration.md):

    python -m experiments.domain_slice --word dog --output corpus/dogs

Writes OUTPUT/{train,valid,test}.{en,de}: the pairs of Multi30k's train, val and test_2016_flickr files whose English
side holds the word (as a whole word, any case; plural "-s" too), as plain parallel files that `data=local` reads.
The slice's training pairs are a part of the demo's own training data: fine-tuning on them shows the mechanics of
adapting a model to a corpus (and what specialising on a slice does), not a shift to a domain the model never saw.
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
from pathlib import Path

MULTI30K = Path(__file__).resolve().parent.parent / "data" / "multi30k"
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


def mentions(word: str) -> re.Pattern:
    return re.compile(rf"\b{re.escape(word)}s?\b", re.IGNORECASE)


def read(split: str, lang: str) -> list[str]:
    with gzip.open(MULTI30K / f"{SPLITS[split]}.{lang}.gz", "rt", encoding="utf-8") as f:
        return f.read().removesuffix("\n").split("\n")  # lines end in \n only: any other break is text


def write_slice(word: str, output: Path, src: str = "en", tgt: str = "de") -> dict[str, int]:
    """Each split's pairs whose source mentions `word`, written as OUTPUT/<split>.<lang>; returns their counts."""
    pattern, files = mentions(word), {}
    for split in SPLITS:
        pairs = [(s, t) for s, t in zip(read(split, src), read(split, tgt), strict=True) if pattern.search(s)]
        for lang, side in ((src, [s for s, _ in pairs]), (tgt, [t for _, t in pairs])):
            files[output / f"{split}.{lang}"] = "".join(line + "\n" for line in side)
    # outputs never destroy inputs: a file of that name holding other text is someone's corpus
    if other := [str(path) for path, text in files.items() if path.exists() and path.read_text("utf-8") != text]:
        raise FileExistsError(f"{other[0]} exists and holds other text: choose another --output (nothing was written)")
    output.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
    return {split: files[output / f"{split}.{src}"].count("\n") for split in SPLITS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--word", required=True, help="the word the English side must hold (e.g. dog)")
    parser.add_argument("--output", type=Path, required=True, help="the corpus folder to write")
    args = parser.parse_args()
    try:
        counts = write_slice(args.word, args.output)
    except FileExistsError as refused:
        print(f"domain_slice: {refused}", file=sys.stderr)  # a bad input: one line, exit 2, as every command here
        sys.exit(2)
    print(f"{args.output}: " + ", ".join(f"{split} {n:,} pairs" for split, n in counts.items()))


if __name__ == "__main__":
    main()
