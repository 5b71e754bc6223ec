"""The lab: a run's one lifecycle and its record (run.py, record.py), the collector that tables a sweep's records
(collect.py), the statistics every verdict comes from (stats.py), the page of tables (page.py) and the check of its
sentences (claims.py). It reads the NMT library below it (nmt.data, nmt.modeling, nmt.training, nmt.decoding, ...),
which never reads it; the commands (nmt/train.py, nmt/table.py) sit above both."""
