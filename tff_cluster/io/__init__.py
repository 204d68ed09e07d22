"""What a run leaves on disk: the run directory's format and readers, the results writer, checkpoints, plots."""
