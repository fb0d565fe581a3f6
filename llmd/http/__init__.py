"""Transport: the sans-IO HTTP/1.1 parser, the asyncio server and SSE framing.

It knows nothing of LLMs, OpenAI or llmd's error shapes: the application hands the
server whatever it needs to answer (for example how a refusal is written).

May import: nothing of llmd.
"""
