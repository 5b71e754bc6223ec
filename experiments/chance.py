"""The page's chance levels written again: every chance marker (nmt/lab/claims.py CHANCE) gets the shortcut share it
names (experiments/shortcuts.py) on its task's evaluation batch of seed 1.

    python -m experiments.chance --cite results/README.md README.md
"""

from __future__ import annotations

from nmt.lab.claims import CHANCE

from experiments.edge_values import marker_shortcuts
from experiments.extrapolate import shortcuts


def cite_chance(text: str) -> str:
    """The text with every chance marker's figure (nmt/lab/claims.py CHANCE) computed again: the shortcut share it names
    on its task's evaluation batch of seed 1 (experiments/extrapolate.py shortcuts; the marker task's,
    experiments/edge_values.py marker_shortcuts, at its one length, 16)."""
    computed: dict[tuple, dict] = {}

    def figure(marker) -> str:
        share, _, beyond = marker.group("share").partition("@")
        key = (marker.group("task"), int(marker.group("length")), int(beyond) if beyond else None)
        if key not in computed:
            computed[key] = (marker_shortcuts(seed=1) if key[0] == "marker"
                             else shortcuts(key[0], key[1], seed=1, beyond=key[2]))
        return marker.group(0).replace(f"-->{marker.group('figure')}<!--", f"-->{computed[key][share]:.3f}<!--", 1)
    return CHANCE.sub(figure, text)


def main(argv: list[str] | None = None) -> None:
    """python -m experiments.chance --cite FILE ...: write the chance markers' figures of these files."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m experiments.chance", description=main.__doc__)
    parser.add_argument("--cite", nargs="+", type=Path, required=True, metavar="FILE")
    for path in parser.parse_args(argv).cite:
        text = path.read_text(encoding="utf-8")
        if (cited := cite_chance(text)) != text:
            path.write_text(cited, encoding="utf-8")
            print(f"{path}: chance levels written again")


if __name__ == "__main__":
    main()
