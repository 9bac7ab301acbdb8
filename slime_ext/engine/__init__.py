"""Rollout engines: the embedded PyTorch engine, the SGLang client and launcher, engine servers and their
pool, weight sync. They share no base class: the loop calls `generate`, `abort`, `flush_cache` and the
weight updates by name on whatever it holds, an engine object or a Ray actor handle."""
