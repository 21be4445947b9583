"""Alembic migrations of the service's database, shipped inside the package and run at start-up."""
