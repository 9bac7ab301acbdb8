"""Training methods: one package per method (`<name>/method.py` hooks, `<name>/config.py` section),
found through `slime_ext.methods.registry`; the hooks every method implements are in `base.py`."""
