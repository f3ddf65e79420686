"""Context (``context.*``): configurations and their assembly, the files read into it from a
resource folder, and token counting."""
