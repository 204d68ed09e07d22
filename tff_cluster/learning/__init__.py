"""What a client and a server do with a gradient: optimizers as values (`optimizers`)."""
