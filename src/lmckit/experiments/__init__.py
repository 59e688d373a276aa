"""Experiments: each reproduced result is a function returning a table and figures."""
