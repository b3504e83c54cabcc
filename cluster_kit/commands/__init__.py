"""Thin click commands: parse -> call the core -> echo. Registered on the group in cli.py."""
