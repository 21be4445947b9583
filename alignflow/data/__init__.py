"""Preference data: schema, readers, validation, splitting, versioning, demo data."""
