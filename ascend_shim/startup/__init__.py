"""Startup: stdlib only. What the interpreter runs before anything is imported."""
