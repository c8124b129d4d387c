"""Celery on Cherami: the kombu transport that ``cherami.kombu`` registers (docs/celery.md)."""
