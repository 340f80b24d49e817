"""The agent's process: its lifecycle, from the launcher to the hand-over."""
