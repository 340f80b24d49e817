"""Leaf utilities every layer may use: errors, settings, logging, quantities, files, the heap,
helper processes."""
