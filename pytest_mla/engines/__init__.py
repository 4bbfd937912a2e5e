"""Engine adapters: the built-in reference engine and, optionally, real engines."""
