"""The `tff` runner and the TFF runtime it owns (workers, types)."""
