"""Prompt and output text: chat templates (the Jinja interpreter), Harmony,
reasoning, tool-call parsing, stop strings, fill-in-the-middle prompts and UTF-8
text streams.

Pure text in, text or deltas out: no engine, no HTTP, no API shapes.

May import: nothing of llmd.
"""
