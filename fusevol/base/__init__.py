"""Leaf utilities every layer may use; they import nothing else of fusevol.

errors         fusevol's exceptions, and which failures are expected
settings       the agent's settings and their defaults (the only place defaults are written)
log            logging: one line an event, key=value fields, journald priorities
quantity       Kubernetes resource quantities, parsed and printed as apimachinery does
fsutil         small file helpers: atomic replace, MkdirAll, flock probes
heap           the C heap: one arena, trimming when idle, allocation tracing
multimap       a dict of sets that holds a lone member bare (indexes of one member a key)
helper_parent  a helper process, from the agent's side: one JSON line asked, one answered
helper_child   the helper process's own side (`python -m` a helper module)
"""
