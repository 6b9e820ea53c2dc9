"""Ahead-of-time tuning: the Module proxy, tune(), save() and load()."""
