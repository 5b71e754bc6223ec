"""The studies: sweeps of the paper's tables at small scale, the synthetic tasks, the result tables and plots, each run
as `python -m experiments.NAME` from a checkout (not part of the installed package). The synthetic studies'
cells run through experiments.grid; experiments depend on nmt/, never the reverse."""
