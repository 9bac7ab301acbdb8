"""SxS interleaved reasoning (METHODS.md section 3): data construction, oracles, metrics, shaping."""
