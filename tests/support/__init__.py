"""Process fixtures and helpers shared by service tests (real Redis, real worker processes)."""
