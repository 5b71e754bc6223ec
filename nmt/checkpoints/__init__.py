"""Checkpoints: the format and rotation (all ranks), averaging, the resume checks (a resumed run is the
same run), one job per output folder; nmt/average.py is the averaging entry point."""
