"""Pure DataFrame -> DataFrame transforms: no reads, writes, actions or session creation."""
