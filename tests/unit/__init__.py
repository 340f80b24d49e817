"""Units in-process, without a mount: each module's contract, table-driven where it can be."""
