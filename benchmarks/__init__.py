"""Speed and memory measurements of nmt/ and the GPU check, each run as `python -m benchmarks.NAME` (not part of the
installed package: they run from a checkout). Every benchmark times through nmt.timing and writes its JSON report
with benchmarks.report.write_report (the command, the date and the machine beside the numbers)."""
