"""Serving: the one executor thread that makes every engine call, the session table
and its admission, session files on disk, prefill planning, speculative drafting
and the metrics registry.

It knows requests only as token ids and sampling settings, never an API's shapes.

May import: llmd.engine, llmd.errors.
"""
