"""Training's parts: the batch rule, optimizer and schedules, the loss, validation, what a run reports,
and the Trainer (its state, one update, the loop); nmt/train.py is the entry point."""
