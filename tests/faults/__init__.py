"""The agent and the parser under faults: killed readers and agents, hung helpers, bad input."""
