"""Profiles and job files: YAML with FILE:LINE, specs and validators, search path, effective settings.

`__all__` is the room's surface: the modules other rooms import. textfile, yamlfile,
yamlhints, problems and jobchecks serve load; spec, specs and vocab are public for
ssh's settings, init and the reference tables.
"""

__all__ = ["documents", "effective", "init_profile", "jobscript", "json_schema", "launch", "load", "overrides", "search", "spec", "specs", "textfile", "validators", "vocab"]
