"""Decode workers: a Celery app whose only task turns image bytes into the model's pixel tensor."""
