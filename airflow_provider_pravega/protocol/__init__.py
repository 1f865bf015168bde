"""Sans-IO Pravega protocol codecs: segment-store wire commands, names, routing hash, stream cuts.

Nothing here does I/O; the embedded server and the client layer both build on these modules.
"""
