"""Benchmarks: `python -m bench` prints issue 7's table (bench/__main__.py)."""

AGENT_ARGS = ("--log-level", "info")
"""The agent as deployed: the test harness's default, debug, writes a line per operation."""
