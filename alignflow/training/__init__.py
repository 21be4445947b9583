"""Pipeline stages: one module per stage with its typed config beside it."""
