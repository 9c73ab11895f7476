"""Reproducible pipelines for the project's headline results."""
