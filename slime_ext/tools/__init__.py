"""Tools users call: the server, checkpoint evaluation, plots, study plumbing."""
