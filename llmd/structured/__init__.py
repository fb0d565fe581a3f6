"""Structured output: the JSON Schema -> grammar compiler and the glue that turns a
response format or a set of tools into the grammar constrained decoding follows.

It knows a request only through the few fields it reads (see constrain.py), and a
tool-call layout through llmd.prompt.

May import: llmd.prompt, llmd.errors.
"""
