"""The position modes as the studies name their rows and options: nmt.modes.Position's values, in the order the
tables show them, and BUCKETS, the row of Shaw's relative mode with model.edge_buckets (a row's name, not a Position:
its vectors are read through T5's log-spaced buckets, nmt/modeling/edges.py)."""

from nmt.modes import Position

ABSOLUTE, RELATIVE, LEARNED, BOTH, NONE, T5, ALIBI, ROPE = (
    p.value for p in (Position.absolute, Position.relative, Position.learned, Position.both, Position.none,
                      Position.t5, Position.alibi, Position.rope))
DESCENDANTS = (ABSOLUTE, RELATIVE, LEARNED, BOTH, NONE, T5, ALIBI, ROPE)  # the descendants table's rows, in order
BUCKETS = "buckets"
