"""Reading and writing what a run leaves on disk (its run directory)."""
