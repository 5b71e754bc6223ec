"""Where a job runs and how, resolved once at its entry point, one concern a module: the process (rank, device,
process group, log: process.py), work across ranks (DDP and compile wrapping, collectives: distributed.py), random
states (rng.py), the CPU allocator (memory.py), the precision policy (precision.py) and stop signals (signals.py).
Training, decoding and the benchmarks all take these from here."""
