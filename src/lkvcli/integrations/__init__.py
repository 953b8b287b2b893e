"""lkv adapters inside other libraries (each module imports its library only when used)."""
