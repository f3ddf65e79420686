"""Storage behind a narrow interface: SQLite embedded default; PostgreSQL can follow."""
