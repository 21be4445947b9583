"""Configs shipped inside the package: the embedded default (the demo)."""
