"""The command-line verbs other than serving: bench, quantize, perplexity, tokenize.

May import: llmd.engine, llmd.errors.
"""
