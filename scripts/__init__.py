"""Entry points: `make up` (scripts.up), `make test` (scripts.run_tests), and their helpers."""
