"""Profiles and job files: YAML with FILE:LINE, specs and validators, search path, effective settings."""
