"""llmd: a small, fast, OpenAI-compatible LLM server for one machine."""
