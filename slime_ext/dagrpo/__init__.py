"""DA-GRPO (METHODS.md section 4): budgeted local-cloud offloading with a dual variable."""
