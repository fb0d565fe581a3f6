"""The native engine as Python sees it: the cffi wrapper over native/include/llmd.h
(the compiled module is llmd._native) and finding or fetching the default model.

May import: llmd._native.
"""

# How an engine's KV cache may store keys and values (llmd_engine_options.kv_type_k
# and kv_type_v): here, so that the command line offers them without loading the engine.
KV_TYPES = ("f16", "q8_0", "q4_0")
