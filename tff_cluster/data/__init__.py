"""Federated data: the client-data container, loaders and partitioners."""
