"""The command-line verbs other than serving: bench, quantize, perplexity, tokenize.

May import: llmd.engine, llmd.errors, llmd.serving.

(`bench --held-sessions` writes session files with the server's own writer,
llmd.serving.session_store, so that the server it starts loads them.)
"""
