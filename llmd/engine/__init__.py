"""The native engine as Python sees it: the cffi wrapper over native/include/llmd.h
(the compiled module is llmd._native) and finding or fetching the default model.

May import: llmd._native.
"""
