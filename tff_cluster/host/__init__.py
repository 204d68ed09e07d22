"""The host side of a run: drivers and their typed host state, the model a run trains, one round, the training loop."""
