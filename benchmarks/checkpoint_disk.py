"""Disk a paper recipe's checkpoints take: the files nmt.train writes, measured by writing them.

For each preset (base, big) with the 32k shared vocabulary: a numbered checkpoint (the weights: what averaging
reads), the whole training state (checkpoint_last.pt / checkpoint_prev.pt: weights + Adam's two moments), and
the folder at its fullest under the recipe's keep_last: keep_last numbered + last + prev + the next last while
it is written.

    python -m benchmarks.checkpoint_disk [--presets base big] [--vocab-size 32000] [--output results/checkpoint_disk.json]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from omegaconf import OmegaConf

from benchmarks.report import write_report
from nmt.checkpoints.checkpoint import WEIGHTS, save_checkpoint
from nmt.compose import preset_job
from nmt.modeling.transformer import Transformer

ROOT = Path(__file__).resolve().parent.parent
RECIPES = {"base": "paper_base", "big": "paper_big"}


def measure(preset: str, vocab_size: int, folder: Path) -> dict:
    job = preset_job(f"model={preset}", f"+experiment={RECIPES[preset]}")
    model = Transformer(job.model, vocab_size)
    optimizer = torch.optim.Adam(model.parameters())
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # Adam's moments exist from the first update on
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 1,
             "config": {"model": OmegaConf.to_container(OmegaConf.structured(job.model), enum_to_str=True)}, "vocab": torch.zeros(800_000, dtype=torch.uint8)}  # spm.model, 32k pieces
    sizes = {}
    for name, keys in (("numbered", WEIGHTS), ("whole_state", tuple(state))):
        path = folder / f"{preset}_{name}.pt"
        save_checkpoint({k: state[k] for k in keys if k in state}, path)
        sizes[name] = path.stat().st_size
        path.unlink()
    keep = job.train.keep_last
    peak = keep * sizes["numbered"] + 3 * sizes["whole_state"]
    before = keep * sizes["whole_state"]  # every numbered checkpoint a whole state, as before
    return {"preset": preset, "recipe": RECIPES[preset], "keep_last": keep, **sizes, "folder_peak": peak,
            "folder_peak_before": before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab-size", type=int, default=32_000)
    parser.add_argument("--presets", nargs="+", choices=list(RECIPES), default=list(RECIPES))
    parser.add_argument("--output", default="results/checkpoint_disk.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        for preset in args.presets:
            rows.append(measure(preset, args.vocab_size, Path(tmp)))
            r = rows[-1]
            print(f"{r['recipe']}: numbered {r['numbered'] / 1e9:.2f} GB, whole state {r['whole_state'] / 1e9:.2f} GB, "
                  f"folder at most {r['folder_peak'] / 1e9:.1f} GB with keep_last {r['keep_last']} "
                  f"(every checkpoint a whole state: {r['folder_peak_before'] / 1e9:.1f} GB)", flush=True)
    write_report(args.output, {"rows": rows})


if __name__ == "__main__":
    main()
