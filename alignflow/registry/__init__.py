"""MLflow tracking helpers, model logging, aliases and promotion policy."""
