"""The host side of a run: what a driver keeps between rounds, the model it trains, one round."""
