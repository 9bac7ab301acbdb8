"""SxS: private think and visible speak blocks in one stream (data builder, oracles, metrics, shaping, RL)."""
