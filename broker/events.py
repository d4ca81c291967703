"""The order of events at one virtual instant, and the time one network hop takes."""

# Incidents, then stores, op flushes, check passes, consumers, bookkeeping, and last the group snapshots, so a
# snapshot sees everything stored or committed at its millisecond.
P_CONTROL, P_STORE, P_OP, P_PASS, P_CONSUMER, P_FLUSH, P_SNAPSHOT, P_END = range(8)
NET_MS = 2  # one network hop
