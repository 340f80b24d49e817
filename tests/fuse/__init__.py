"""The real agent (`tests/agent.py`) on a manifest directory and real FUSE: what a pod sees."""
