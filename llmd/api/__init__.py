"""The HTTP API: routes, access control, request validation, the shared reply core,
and one module per API surface (chat completions, completions, responses, Anthropic
messages, llama.cpp's /completion and /infill, Ollama's /api/, embeddings, reranking).

May import: llmd.structured, llmd.prompt, llmd.serving, llmd.engine, llmd.http, llmd.errors.
"""
