"""Data files shipped inside the package (stories260K, the bundled default target)."""
