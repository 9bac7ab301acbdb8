"""Task data: synthetic math problems, JSONL loading, prompt templates."""
