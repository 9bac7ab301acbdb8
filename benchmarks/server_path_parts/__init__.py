"""The parts of benchmarks/server_path.py (the entry point, run as a script), one job per module."""
